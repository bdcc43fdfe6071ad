"""What training scripts import: submit actions, wait for results, end trajectories.

    from tangram_celery.client import TangramClient, code_action, test_run_action
    with TangramClient.from_env() as client:
        handle = client.submit(code_action("traj-1", "print(6 * 7)"))
        result = handle.result(timeout=60)          # or: await handle  (asyncio rollouts)
        print(result.output["stdout"], result.act)  # ACT split into queue / exec / overhead
        client.end_trajectory("traj-1")

Every action is validated here, before anything is sent; a bad one raises
:class:`~tangram_celery.errors.ValidationError` naming the field.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import redis
from celery import Celery
from kombu.exceptions import OperationalError

from tangram_celery import keys
from tangram_celery.action import Action, ActionResult, parse_action
from tangram_celery.client.inflight import InFlight
from tangram_celery.client.router import Router
from tangram_celery.client.routing import MemoryWait
from tangram_celery.client.waiter import ResultWaiter
from tangram_celery.client.waitlist import Waitlist
from tangram_celery.connection import connect
from tangram_celery.errors import (
    ActionFailed,
    ActionTimeout,
    BrokerAuthFailed,
    BrokerUnreachable,
)
from tangram_celery.observe.progress import result_progress
from tangram_celery.pools.conversion import action_limits
from tangram_celery.settings import Settings
from tangram_celery.tasks.app import END_TRAJECTORY_TASK, make_app
from tangram_celery.tasks.clock import BrokerClock
from tangram_celery.tasks.ledger import Ledger

log = logging.getLogger(__name__)


@dataclass
class ActionHandle:
    """A submitted action: wait for it with :meth:`result` or ``await handle``.

    ``queue`` is empty while the action waits for memory (its trajectory is not placed yet);
    ``published`` is when it was handed to a queue (the broker's, or the memory line), so the
    wait for memory counts in the ACT's ``queue`` part.
    """

    action: Action
    queue: str
    submitted: float
    published: float
    _client: TangramClient = field(repr=False)

    @property
    def id(self) -> str:
        """The action id (also the Celery task id)."""
        return self.action.id

    def result(self, timeout: float | None = None) -> ActionResult:
        """Block until the action's result is stored; raises :class:`ActionTimeout` after
        ``timeout`` seconds (the action itself keeps running)."""
        future = self._client._waiter.wait_for(self._client._result_key(self.id))
        try:
            meta = future.result(timeout)
        except FutureTimeout:
            raise ActionTimeout(
                f"action {self.id} ({self.action.summary()}) has no result after {timeout} s; "
                "it may still be queued or running: wait again or check `tangram status`"
            ) from None
        return self._finish(meta)

    async def aresult(self, timeout: float | None = None) -> ActionResult:
        """The awaitable form of :meth:`result` for asyncio rollouts."""
        future = self._client._waiter.wait_for(self._client._result_key(self.id))
        try:
            meta = await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except TimeoutError:
            raise ActionTimeout(f"action {self.id} has no result after {timeout} s") from None
        return self._finish(meta)

    def __await__(self) -> Generator[Any, None, ActionResult]:
        return self.aresult().__await__()

    def _finish(self, meta: Mapping[str, Any]) -> ActionResult:
        self._client._forget(self.id)
        completed = self._client.clock.now()
        if meta.get("status") != "SUCCESS" or not isinstance(meta.get("result"), Mapping):
            meta = self._client._stored_instead(self.id, meta)
        if meta.get("status") != "SUCCESS" or not isinstance(meta.get("result"), Mapping):
            detail = meta.get("result")
            raise ActionFailed(
                f"action {self.id} failed in the worker ({meta.get('status')}): {detail}"
            )
        result = ActionResult.from_json(meta["result"])
        result.timings.submitted = self.submitted
        result.timings.published = self.published
        result.timings.completed = completed
        return result


class TangramClient:
    """Submits validated actions to the right queue and collects their results.

    A new trajectory that no node has the memory for waits up to its action's timeout, or
    ``memory_wait_s`` when that is longer (a server that queues requests passes its own budget).
    """

    def __init__(self, settings: Settings, app: Celery | None = None,
                 memory_wait_s: float = 0.0) -> None:
        self.settings = settings
        self.app = app or make_app(settings)
        self._redis = connect(settings.broker)
        self._router = Router(self._redis, settings)
        self._ledger = Ledger(self._redis, settings.broker.result_ttl_s)
        self._action_ids: dict[bytes, str] = {}
        self.clock = BrokerClock(self._redis, settings.broker.clock_skew_s)
        """Where the client's stamps come from: the broker's clock, read here."""
        self._in_flight = InFlight(self._redis, settings, self._router.registry, self._ledger,
                                   self._publish, self._result_key, self.clock.now)
        self._waiter = ResultWaiter(connect(settings.broker, settings.broker.result_backend_url),
                                    fallback=self._ledger_records,
                                    on_sweep=self._in_flight.audit)
        self._waitlist = Waitlist(self._router, self._ledger, self._send,
                                  settings.actions.default_timeout_s, memory_wait_s)
        self._limits = action_limits(settings)
        self._reached = False

    @classmethod
    def from_env(cls) -> TangramClient:
        """A client configured from ``TANGRAM_`` environment variables."""
        return cls(Settings.from_env())

    def __enter__(self) -> TangramClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release connections and the waiter thread; actions still waiting for memory are
        answered ``cancelled``."""
        self._waitlist.close()
        self._waiter.close()
        self._redis.close()

    def submit(self, action: Action | Mapping[str, Any]) -> ActionHandle:
        """Validate, stamp, route and publish one action; returns its handle at once.

        A CPU action of a new trajectory that no node has the memory for now does not block
        here: it waits, FCFS, for memory (see :mod:`.waitlist`), and its handle's result
        waits with it. Raises :class:`ValidationError` or :class:`RoutingError` for an action no
        pool can ever run, and :class:`BrokerUnreachable` when Redis does not answer.

        Actions of one trajectory share its environment but are not run one after another: a
        node starts those it holds as cores allow. Submit an action that depends on another's
        files after that one's result, as an agent's next step would.
        """
        self._first_contact()
        submitted = self.clock.now()
        body = action.to_json() if isinstance(action, Action) else dict(action)
        body["submitted_at"] = submitted
        checked = parse_action(body, self._limits)
        try:
            if checked.pool == "cpu" and self._waitlist.holds(checked.trajectory_id):
                return self._park(checked, None, submitted)
            decided = self._router.route(checked)
            if self._router.dropped:
                self._waitlist.answer_dropped()
            if decided.wait is not None:
                return self._park(checked, decided.wait, submitted)
            published = self.clock.now()
            self._send(checked, decided.queue)
        except (redis.ConnectionError, redis.TimeoutError, OperationalError) as exc:
            raise broker_error(self.settings.broker.redis_url, exc) from None
        return ActionHandle(checked, decided.queue, submitted, published, self)

    def _first_contact(self) -> None:
        """Ping Redis once, without retries, before the first action: a broker that was never
        reached is a wrong URL or a stack not started, and says so at once. Once reached, a
        lost connection is retried for ``TANGRAM_REDIS_RETRY_S`` (a restart or a failover)."""
        if self._reached:
            return
        probe = connect(self.settings.broker, retry_s=0.0)
        try:
            probe.ping()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise broker_error(self.settings.broker.redis_url, exc) from None
        finally:
            probe.close()
        self._reached = True

    def _park(self, action: Action, wait: MemoryWait | None, submitted: float) -> ActionHandle:
        """Hand an action to the memory line; its handle's result waits for it."""
        self._waitlist.park(action, wait, submitted)
        return ActionHandle(action, "", submitted, self.clock.now(), self)

    def _send(self, action: Action, queue: str) -> None:
        """Publish and remember the action for the lost-action audit."""
        self._publish(action, queue)
        self._in_flight.add(action, queue, time.time())

    def _publish(self, action: Action, queue: str) -> None:
        self.app.send_task(
            keys.task_name(action.kind),
            args=[action.to_json()],
            queue=queue,
            task_id=action.id,
            argsrepr=action.summary(),
            kwargsrepr="{}",
        )

    def submit_many(self, actions: Iterable[Action | Mapping[str, Any]]) -> list[ActionHandle]:
        """Submit several actions in order; validation of all happens before any is sent."""
        bodies = [a.to_json() if isinstance(a, Action) else dict(a) for a in actions]
        for body in bodies:
            parse_action(body, self._limits)
        return [self.submit(body) for body in bodies]

    def run_batch(
        self, actions: Iterable[Action | Mapping[str, Any]], timeout: float | None = None,
        progress: bool = False,
    ) -> list[ActionResult]:
        """Submit all actions, then return their results in the order given.

        ``progress=True`` shows a ``rich`` progress bar on stderr while results arrive.
        """
        handles = self.submit_many(actions)
        deadline = None if timeout is None else time.monotonic() + timeout
        results = []
        with self._progress(handles, progress):
            for handle in handles:
                left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                results.append(handle.result(left))
        return results

    async def arun_batch(
        self, actions: Iterable[Action | Mapping[str, Any]], timeout: float | None = None,
        progress: bool = False,
    ) -> list[ActionResult]:
        """The asyncio form of :meth:`run_batch`."""
        handles = self.submit_many(actions)
        with self._progress(handles, progress):
            return list(await asyncio.gather(*(h.aresult(timeout) for h in handles)))

    @contextlib.contextmanager
    def _progress(self, handles: Sequence[ActionHandle], enabled: bool) -> Iterator[None]:
        """Advance a progress bar as each handle's result arrives (nothing when disabled)."""
        if not enabled:
            yield
            return
        with result_progress(len(handles)) as advance:
            for handle in handles:
                self._waiter.wait_for(self._result_key(handle.id)).add_done_callback(
                    _ignore_argument(advance)
                )
            yield

    def end_trajectory(self, trajectory_id: str, wait_s: float = 0.0) -> bool:
        """Free a trajectory's environment (its files, its memory reservation) on its node.

        With ``wait_s`` > 0, return only once the node has ended it (True), or False when it
        has not confirmed within ``wait_s``: an action submitted after a confirmed end starts
        in a fresh environment. Without it the end is sent and not waited for (True).
        """
        registry = self._router.registry
        self._waitlist.cancel(trajectory_id, "the trajectory ended before it was placed")
        node = registry.pinned_node(trajectory_id)
        self._router.forget(trajectory_id)
        if node is None:
            return True
        alive = {n.name for n in registry.nodes() if n.alive}
        if node not in alive:
            registry.unpin(trajectory_id)
            return True
        task_id = f"end-{trajectory_id}-{uuid.uuid4().hex[:8]}"
        self.app.send_task(END_TRAJECTORY_TASK, args=[trajectory_id],
                           queue=keys.cpu_queue(node), task_id=task_id)
        if wait_s <= 0:
            return True
        key = self._task_key(task_id)
        try:
            self._waiter.wait_for(key).result(timeout=wait_s)
        except FutureTimeout:
            self._waiter.forget(key)
            return False
        return True

    def _ledger_records(self, result_keys: list[bytes]) -> list[dict[str, Any] | None]:
        """Ready Celery-style records from the action ledger for pending result keys."""
        ids = [self._action_ids.get(key) for key in result_keys]
        known = [i for i in ids if i is not None]
        stored = dict(zip(known, self._ledger.results(known), strict=True))
        records: list[dict[str, Any] | None] = []
        for action_id in ids:
            record = stored.get(action_id) if action_id is not None else None
            records.append(None if record is None else {"status": "SUCCESS", "result": record})
        return records

    def _stored_instead(self, action_id: str, meta: Mapping[str, Any]) -> Mapping[str, Any]:
        """The action's result in the ledger when Celery recorded a failure of its task (a
        worker whose result was stored, but whose task then failed to report it to Celery's
        backend, as across a failover), else ``meta``."""
        [stored] = self._ledger.results([action_id])
        return meta if stored is None else {"status": "SUCCESS", "result": stored}

    def _forget(self, action_id: str) -> None:
        raw = self.app.backend.get_key_for_task(action_id)
        self._action_ids.pop(raw if isinstance(raw, bytes) else str(raw).encode(), None)
        self._in_flight.discard(action_id)

    def _task_key(self, task_id: str) -> bytes:
        raw = self.app.backend.get_key_for_task(task_id)
        return raw if isinstance(raw, bytes) else str(raw).encode()

    def _result_key(self, action_id: str) -> bytes:
        key = self._task_key(action_id)
        self._action_ids[key] = action_id
        return key


def _ignore_argument(callback: Callable[[], None]) -> Callable[[Any], None]:
    return lambda _: callback()


AUTH_MARKS = ("WRONGPASS", "NOAUTH", "invalid password", "username-password")


def broker_error(url: str, exc: Exception) -> BrokerUnreachable:
    """The project's error for a failed broker call: :class:`BrokerAuthFailed` when Redis
    refused the credentials, else :class:`BrokerUnreachable`; one line, no password."""
    reason = " ".join(str(exc).split())
    password = urlsplit(url).password
    if password:
        reason = reason.replace(password, "***")
    if isinstance(exc, redis.AuthenticationError) or any(m in reason for m in AUTH_MARKS):
        return BrokerAuthFailed(url, reason)
    return BrokerUnreachable(url, reason)



