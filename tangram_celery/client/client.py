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
import threading
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
from tangram_celery.client.feasibility import check_api, check_cpu, check_gpu
from tangram_celery.client.recovery import audit, broker_action_ids, stranded, take_action
from tangram_celery.client.waiter import ResultWaiter, decode_meta
from tangram_celery.errors import (
    ActionFailed,
    ActionTimeout,
    BrokerAuthFailed,
    BrokerUnreachable,
)
from tangram_celery.keys import DEFAULT_GPU_POOL
from tangram_celery.managers.basic import parse_api_limits
from tangram_celery.observe.progress import result_progress
from tangram_celery.pools.conversion import action_limits
from tangram_celery.pools.inventory import GpuPoolView, gpu_pool_view
from tangram_celery.pools.registry import Registry
from tangram_celery.pools.routing import queue_for, trajectory_memory_mb
from tangram_celery.pools.serving import rejected_result
from tangram_celery.settings import Settings
from tangram_celery.tasks.app import END_TRAJECTORY_TASK, celery_config, make_app
from tangram_celery.tasks.ledger import Ledger

log = logging.getLogger(__name__)
PIN_CACHE_S = 1.0
GPU_POOL_CACHE_S = 5.0


@dataclass
class ActionHandle:
    """A submitted action: wait for it with :meth:`result` or ``await handle``."""

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
        completed = time.time()
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
    """Submits validated actions to the right queue and collects their results."""

    def __init__(self, settings: Settings, app: Celery | None = None) -> None:
        self.settings = settings
        self.app = app or make_app(settings)
        self._redis = redis.Redis.from_url(settings.redis_url)
        self._registry = Registry(self._redis, settings.node_ttl_s, settings.trajectory_ttl_s)
        self._ledger = Ledger(self._redis, settings.result_ttl_s)
        self._action_ids: dict[bytes, str] = {}
        self._waiter = ResultWaiter(redis.Redis.from_url(settings.result_backend_url),
                                    fallback=self._ledger_records, on_sweep=self._audit)
        self._sent_lock = threading.Lock()
        self._sent: dict[str, tuple[ActionHandle, float]] = {}
        self._suspects: dict[str, float] = {}
        self._last_audit = 0.0
        self._limits = action_limits(settings)
        self._pins: dict[str, tuple[str, float]] = {}
        self._apis = parse_api_limits(settings.api_limits)
        self._node_cores: dict[str, int] = {}
        self._gpu_pools: dict[str, tuple[GpuPoolView | None, float]] = {}
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
        """Release connections and the waiter thread."""
        self._waiter.close()
        self._redis.close()

    def submit(self, action: Action | Mapping[str, Any]) -> ActionHandle:
        """Validate, stamp, route and publish one action; returns its handle at once.

        Raises :class:`ValidationError` or :class:`RoutingError` for an action no pool can ever
        run, and :class:`BrokerUnreachable` when Redis does not answer.
        """
        submitted = time.time()
        body = action.to_json() if isinstance(action, Action) else dict(action)
        body["submitted_at"] = submitted
        checked = parse_action(body, self._limits)
        if checked.apis():
            check_api(checked, self._apis)
        try:
            if not self._reached:
                self._redis.ping()
                self._reached = True
            queue = queue_for(checked, self._node_for(checked))
            published = time.time()
            self._publish(checked, queue)
        except (redis.ConnectionError, redis.TimeoutError, OperationalError) as exc:
            raise broker_error(self.settings.redis_url, exc) from None
        handle = ActionHandle(checked, queue, submitted, published, self)
        with self._sent_lock:
            self._sent[checked.id] = (handle, published)
        return handle

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

    def end_trajectory(self, trajectory_id: str) -> None:
        """Free a trajectory's environment (its files, its memory reservation) on its node."""
        node = self._registry.pinned_node(trajectory_id)
        self._pins.pop(trajectory_id, None)
        if node is None:
            return
        alive = {n.name for n in self._registry.nodes() if n.alive}
        if node not in alive:
            self._registry.unpin(trajectory_id)
            return
        self.app.send_task(
            END_TRAJECTORY_TASK,
            args=[trajectory_id],
            queue=keys.cpu_queue(node),
            task_id=f"end-{trajectory_id}-{uuid.uuid4().hex[:8]}",
        )

    def _node_for(self, action: Action) -> str | None:
        if action.pool != "cpu":
            if action.pool == "gpu":
                pool = str(action.payload.get("pool", DEFAULT_GPU_POOL))
                check_gpu(action, self._gpu_pool(pool))
            return None
        cached = self._pins.get(action.trajectory_id)
        now = time.monotonic()
        if cached is not None and now - cached[1] < PIN_CACHE_S:
            node = cached[0]
        else:
            memory = trajectory_memory_mb(action, self.settings.trajectory_memory_mb)
            node = self._registry.pin(action.trajectory_id, int(action.units().min), memory)
            self._pins[action.trajectory_id] = (node, now)
        if self._node_cores.get(node, 0) < action.units().min:
            self._node_cores = {n.name: n.cores for n in self._registry.nodes()}
        if node in self._node_cores:
            check_cpu(action, node, self._node_cores[node])
        return node

    def _gpu_pool(self, name: str) -> GpuPoolView | None:
        """What GPU pool ``name`` publishes (cached a few seconds), if anything."""
        cached = self._gpu_pools.get(name)
        now = time.monotonic()
        if cached is not None and now - cached[1] < GPU_POOL_CACHE_S:
            return cached[0]
        raw = self._redis.hgetall(keys.gpu_pool(name))
        view = gpu_pool_view(name, raw, time.time(), self.settings.node_ttl_s) if raw else None
        self._gpu_pools[name] = (view, now)
        return view

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

    def _forget(self, action_id: str) -> None:
        raw = self.app.backend.get_key_for_task(action_id)
        self._action_ids.pop(raw if isinstance(raw, bytes) else str(raw).encode(), None)
        with self._sent_lock:
            self._sent.pop(action_id, None)

    def _audit(self) -> None:
        """Publish again the unfinished actions the broker lost (see :mod:`.recovery`); runs on
        the waiter thread at most every ``recovery_audit_s`` seconds."""
        every = self.settings.recovery_audit_s
        now = time.time()
        if every <= 0 or now - self._last_audit < every:
            return
        self._last_audit = now
        with self._sent_lock:
            overdue = [h for h, at in self._sent.values() if now - at >= every]
        if not overdue:
            self._suspects.clear()
            return
        options = celery_config(self.settings)["broker_transport_options"]
        ids = [h.id for h in overdue]
        try:
            present = broker_action_ids(self._redis, {h.queue for h in overdue},
                                        str(options["sep"]), list(options["priority_steps"]))
            finished = self._finished(ids)
        except redis.RedisError as exc:
            log.info("lost-action audit skipped: Redis did not answer (%s)", exc)
            return
        outcome = audit(ids, present, finished, self._suspects, now, every)
        self._suspects = dict(outcome.suspects)
        by_id = {h.id: h for h in overdue}
        with self._sent_lock:
            for action_id in outcome.finished:
                self._sent.pop(action_id, None)
        for action_id in outcome.lost:
            self._republish(by_id[action_id])
        waiting = [h for h in overdue if h.id in present and h.id not in finished]
        try:
            self._answer_stranded(waiting)
        except redis.RedisError as exc:
            log.info("stranded-action check skipped: Redis did not answer (%s)", exc)

    def _answer_stranded(self, waiting: list[ActionHandle]) -> None:
        """Answer ``node_lost`` for waiting actions queued on a CPU node that stopped
        heart-beating ``stranded_after_s`` ago (see :mod:`.recovery`)."""
        after = self.settings.stranded_after_s
        queues = {h.id: h.queue for h in waiting if keys.cpu_node_of_queue(h.queue)}
        if after <= 0 or not queues:
            return
        views = Registry(self._redis, after, self.settings.trajectory_ttl_s).nodes()
        dead = {view.name for view in views if not view.alive}
        options = celery_config(self.settings)["broker_transport_options"]
        by_id = {h.id: h for h in waiting}
        for action_id in stranded(queues, dead):
            handle = by_id[action_id]
            taken = take_action(self._redis, action_id, handle.queue, str(options["sep"]),
                                list(options["priority_steps"]))
            if taken is not None:
                self._fail_node_lost(handle, keys.cpu_node_of_queue(handle.queue) or "", after)

    def _fail_node_lost(self, handle: ActionHandle, node: str, after: float) -> None:
        reason = (f"node_lost: CPU node {node} has sent no heartbeat for over {after:g} s while "
                  f"this action was queued for it; the trajectory's environment was on that "
                  "node and is gone. Restart the trajectory: its next action goes to a live node")
        log.warning("action %s: %s", handle.id, reason)
        self._ledger.store(handle.id, rejected_result(handle.action.to_json(), reason, node,
                                                      time.time(), status="node_lost"))
        self._registry.unpin(handle.action.trajectory_id)

    def _finished(self, action_ids: list[str]) -> set[str]:
        celery_keys = [self._result_key(i) for i in action_ids]
        stored = self._redis.mget(celery_keys)
        ledger = self._ledger.results(action_ids)
        return {i for i, raw, record in zip(action_ids, stored, ledger, strict=True)
                if decode_meta(raw) is not None or record is not None}

    def _republish(self, handle: ActionHandle) -> None:
        log.warning("action %s (%s) was lost by the broker in transit (in no queue, held by no "
                    "worker, no result); publishing it again to %s", handle.id,
                    handle.action.summary(), handle.queue)
        try:
            self._publish(handle.action, handle.queue)
            self._redis.incr(keys.REPUBLISHED_ACTIONS)
        except (redis.RedisError, OperationalError) as exc:
            log.warning("could not publish %s again yet (%s); the next audit retries", handle.id,
                        exc)
            return
        with self._sent_lock:
            if handle.id in self._sent:
                self._sent[handle.id] = (handle, time.time())

    def _result_key(self, action_id: str) -> bytes:
        raw = self.app.backend.get_key_for_task(action_id)
        key = raw if isinstance(raw, bytes) else str(raw).encode()
        self._action_ids[key] = action_id
        return key


def _ignore_argument(callback: Callable[[], None]) -> Callable[[Any], None]:
    return lambda _: callback()


def code_action(
    trajectory_id: str, code: str, *, cpu: int | tuple[int, int] = 1, **fields: Any
) -> Action:
    """A Python snippet run in the trajectory's sandbox (kind ``exec``)."""
    return _build("exec", trajectory_id, {"code": code, **fields.pop("payload", {})}, cpu, fields)


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


def command_action(
    trajectory_id: str, cmd: str, *, cpu: int | tuple[int, int] = 1, **fields: Any
) -> Action:
    """A shell command run in the trajectory's sandbox (kind ``exec``)."""
    return _build("exec", trajectory_id, {"cmd": cmd, **fields.pop("payload", {})}, cpu, fields)


def test_run_action(
    trajectory_id: str,
    cmd: str = "python3 -m pytest -q",
    *,
    cpu: int | tuple[int, int] = (1, 4),
    elasticity: Any = None,
    **fields: Any,
) -> Action:
    """An elastic test run (kind ``test_run``); ``pytest`` gets ``-n k`` for ``k`` cores."""
    if elasticity is not None:
        fields["elasticity"] = elasticity
    return _build("test_run", trajectory_id, {"cmd": cmd, **fields.pop("payload", {})}, cpu,
                  fields)


test_run_action.__test__ = False  # type: ignore[attr-defined]


def _build(
    kind: str, trajectory_id: str, payload: dict[str, Any], cpu: int | tuple[int, int],
    fields: dict[str, Any],
) -> Action:
    if "files" in fields:
        payload["files"] = fields.pop("files")
    cost = dict(fields.pop("cost", {}))
    cost.setdefault("cpu", list(cpu) if isinstance(cpu, tuple) else cpu)
    body = {"kind": kind, "trajectory_id": trajectory_id, "payload": payload, "cost": cost,
            **fields}
    return parse_action(body)
