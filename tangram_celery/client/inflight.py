"""The actions a client has sent and not yet seen answered, and the audit that rescues them.

At most every ``TANGRAM_RECOVERY_AUDIT_S`` seconds (on the result waiter's thread) the client
checks the actions it sent at least that long ago: one the broker lost in transit is published
again under the same id, and one still queued for a CPU node that stopped heart-beating
``TANGRAM_STRANDED_AFTER_S`` ago is taken out of the broker and answered ``node_lost``. The
rules and the pure decision are in :mod:`.recovery`; this module is their edge.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from kombu.exceptions import OperationalError

from tangram_celery import keys
from tangram_celery.action import Action
from tangram_celery.client.recovery import (
    Stranded,
    audit,
    broker_action_ids,
    stranded,
    take_action,
)
from tangram_celery.client.waiter import decode_meta
from tangram_celery.pools.registry import Registry
from tangram_celery.pools.serving import rejected_result
from tangram_celery.settings import Settings
from tangram_celery.tasks.actlog import worker_view
from tangram_celery.tasks.app import celery_config
from tangram_celery.tasks.ledger import Ledger

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sent:
    """One action as published: where to, and when."""

    action: Action
    queue: str
    at: float

    @property
    def id(self) -> str:
        """The action id."""
        return self.action.id


class InFlight:
    """The unanswered actions of one client (thread-safe), and their audit."""

    def __init__(
        self, client: redis.Redis, settings: Settings, registry: Registry, ledger: Ledger,
        publish: Callable[[Action, str], None], result_key: Callable[[str], bytes],
        stamp: Callable[[], float] = time.time,
    ) -> None:
        """``stamp`` reads the clock the client's result stamps are on (the broker's)."""
        self.settings = settings
        self._redis = client
        self._registry = registry
        self._ledger = ledger
        self._publish = publish
        self._result_key = result_key
        self._stamp = stamp
        self._lock = threading.Lock()
        self._sent: dict[str, Sent] = {}
        self._suspects: dict[str, float] = {}
        self._last_audit = 0.0

    def add(self, action: Action, queue: str, at: float) -> None:
        """Remember an action published to ``queue`` at ``at``."""
        with self._lock:
            self._sent[action.id] = Sent(action, queue, at)

    def discard(self, action_id: str) -> None:
        """Forget an action whose result arrived."""
        with self._lock:
            self._sent.pop(action_id, None)

    def audit(self) -> None:
        """Publish again the unfinished actions the broker lost (see :mod:`.recovery`), and
        answer those stranded on a dead node; does nothing until ``recovery_audit_s`` has
        passed since the last audit."""
        every = self.settings.client.recovery_audit_s
        now = time.time()
        if every <= 0 or now - self._last_audit < every:
            return
        self._last_audit = now
        with self._lock:
            overdue = [s for s in self._sent.values() if now - s.at >= every]
        if not overdue:
            self._suspects.clear()
            return
        options = celery_config(self.settings)["broker_transport_options"]
        ids = [s.id for s in overdue]
        try:
            present = broker_action_ids(self._redis, {s.queue for s in overdue},
                                        str(options["sep"]), list(options["priority_steps"]))
            finished = self._finished(ids)
        except redis.RedisError as exc:
            log.info("lost-action audit skipped: Redis did not answer (%s)", exc)
            return
        outcome = audit(ids, present, finished, self._suspects, now, every)
        self._suspects = dict(outcome.suspects)
        by_id = {s.id: s for s in overdue}
        with self._lock:
            for action_id in outcome.finished:
                self._sent.pop(action_id, None)
        for action_id in outcome.lost:
            self._republish(by_id[action_id])
        waiting = [s for s in overdue if s.id in present and s.id not in finished]
        try:
            self._answer_stranded(waiting)
        except redis.RedisError as exc:
            log.info("stranded-action check skipped: Redis did not answer (%s)", exc)

    def _answer_stranded(self, waiting: list[Sent]) -> None:
        """Answer ``node_lost`` for waiting actions queued on a CPU node that stopped
        heart-beating ``stranded_after_s`` ago (see :mod:`.recovery`)."""
        after = self.settings.client.stranded_after_s
        queues = {s.id: s.queue for s in waiting if keys.cpu_node_of_queue(s.queue)}
        if after <= 0 or not queues:
            return
        views = Registry(self._redis, after, self.settings.actions.trajectory_ttl_s).nodes()
        dead = {view.name for view in views if not view.alive}
        options = celery_config(self.settings)["broker_transport_options"]
        by_id = {s.id: s for s in waiting}
        for action_id in stranded(queues, dead):
            sent = by_id[action_id]
            node = keys.cpu_node_of_queue(sent.queue) or ""
            reason, answer = self._node_lost(sent, node, after)
            taken = take_action(self._redis, action_id, sent.queue, str(options["sep"]),
                                list(options["priority_steps"]), Stranded(
                                    node, after, json.dumps(answer, separators=(",", ":")),
                                    self.settings.broker.result_ttl_s))
            if taken is not None:
                log.warning("action %s: %s", sent.id, reason)
                self._registry.unpin(sent.action.trajectory_id)

    def _node_lost(self, sent: Sent, node: str, after: float) -> tuple[str, dict[str, Any]]:
        """Why ``sent`` is answered ``node_lost``, and the answer."""
        reason = (f"node_lost: CPU node {node} has sent no heartbeat for over {after:g} s while "
                  f"this action was queued for it; the trajectory's environment was on that "
                  "node and is gone. Restart the trajectory under a new trajectory id: its "
                  "actions go to a live node (under the old id, a node that comes back may "
                  "still hold the old environment)")
        message, now = sent.action.to_json(), self._stamp()
        answer = rejected_result(message, reason, node, now, status="node_lost")
        answer["timings"]["stored"] = now
        return reason, worker_view(answer, message)

    def _finished(self, action_ids: list[str]) -> set[str]:
        celery_keys = [self._result_key(i) for i in action_ids]
        stored = self._redis.mget(celery_keys)
        ledger = self._ledger.results(action_ids)
        return {i for i, raw, record in zip(action_ids, stored, ledger, strict=True)
                if decode_meta(raw) is not None or record is not None}

    def _republish(self, sent: Sent) -> None:
        log.warning("action %s (%s) was lost by the broker in transit (in no queue, held by no "
                    "worker, no result); publishing it again to %s", sent.id,
                    sent.action.summary(), sent.queue)
        try:
            self._publish(sent.action, sent.queue)
            self._redis.incr(keys.REPUBLISHED_ACTIONS)
        except (redis.RedisError, OperationalError) as exc:
            log.warning("could not publish %s again yet (%s); the next audit retries", sent.id,
                        exc)
            return
        with self._lock:
            if sent.id in self._sent:
                self._sent[sent.id] = Sent(sent.action, sent.queue, time.time())
