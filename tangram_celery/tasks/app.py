"""The Celery app factory and tangram's tasks.

``make_app(settings)`` builds a configured app (JSON only, acks late, FCFS-friendly prefetch) and
registers one task per action kind, so Flower shows readable names. Tasks are thin: they hand the
message to the runtime attached to the worker's app (a
:class:`~tangram_celery.pools.cpu_pool.CpuNode` or a GPU/API pool runtime). Nothing connects at
import time or in the factory.
"""

from __future__ import annotations

import logging
import time
import uuid
import weakref
from typing import Any, Protocol

import redis
from celery import Celery, Task
from celery.worker.consumer import Consumer
from kombu.message import Message

from tangram_celery import keys
from tangram_celery.action.model import ID_PATTERN
from tangram_celery.connection import celery_options, connect
from tangram_celery.errors import AlreadyAnswered, ServiceError
from tangram_celery.settings import BrokerSettings, Settings
from tangram_celery.tasks import actlog
from tangram_celery.tasks.clock import BrokerClock, shifted
from tangram_celery.tasks.ledger import Ledger, Start

log = logging.getLogger(__name__)

END_TRAJECTORY_TASK = "tangram.control.end_trajectory"
CLAIM_POLL_S = 0.5


class Runtime(Protocol):
    """What a worker process plugs into its app to execute tangram's tasks."""

    def execute(self, message: dict[str, Any], received: float) -> dict[str, Any]:
        """Run one action message; returns the result as JSON."""

    def end_trajectory(self, trajectory_id: str) -> None:
        """Free a trajectory's environment on this worker."""


_RUNTIMES: weakref.WeakKeyDictionary[Celery, Runtime] = weakref.WeakKeyDictionary()
_LEDGERS: weakref.WeakKeyDictionary[Celery, Ledger] = weakref.WeakKeyDictionary()
_ACTS_CLIENTS: weakref.WeakKeyDictionary[Celery, redis.Redis] = weakref.WeakKeyDictionary()
_CLOCKS: weakref.WeakKeyDictionary[Celery, BrokerClock] = weakref.WeakKeyDictionary()
_SETTINGS: weakref.WeakKeyDictionary[Celery, Settings] = weakref.WeakKeyDictionary()


def attach_runtime(app: Celery, runtime: Runtime, ledger: Ledger | None = None,
                   clock: BrokerClock | None = None) -> None:
    """Make ``runtime`` execute the tasks this app's worker receives.

    With a ``ledger``, results are idempotent per action id and undecodable messages are
    dead-lettered (see :mod:`tangram_celery.tasks.ledger`). With a ``clock``, the worker's
    stamps on each result are moved onto the broker's clock (:mod:`tangram_celery.tasks.clock`).
    """
    _RUNTIMES[app] = runtime
    if ledger is not None:
        _LEDGERS[app] = ledger
    if clock is not None:
        _CLOCKS[app] = clock


def runtime_of(app: Celery) -> Runtime:
    """The runtime attached to ``app``; a clear error in a process that is not a tangram worker."""
    try:
        return _RUNTIMES[app]
    except KeyError:
        raise ServiceError(
            "this process has no tangram runtime: start workers with `tangram worker cpu ...`"
        ) from None


def celery_config(settings: Settings) -> dict[str, Any]:
    """The Celery configuration tangram relies on: JSON only, late acks, FCFS-friendly
    prefetch and priorities, and the broker and backend of :func:`celery_options` (a
    Sentinel-managed Redis too)."""
    redis_options = celery_options(settings.broker)
    return {
        **redis_options,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "broker_transport_options": {
            "visibility_timeout": settings.visibility_timeout_s,
            "sep": ":",
            "priority_steps": list(range(10)),
            "queue_order_strategy": "priority",
            "unacked_restore_interval": settings.restore_interval_s,
            "unacked_restore_throttle": 1,
            **redis_options["broker_transport_options"],
        },
        "task_publish_retry_policy": {
            "max_retries": 30, "interval_start": 0.05, "interval_step": 0.2, "interval_max": 1.0,
        },
        "result_backend_transport_options": {
            "retry_policy": {"timeout": max(5.0, settings.broker.retry_s)},
            **redis_options["result_backend_transport_options"],
        },
        "result_expires": settings.broker.result_ttl_s,
        "task_send_sent_event": True,
        "worker_send_task_events": True,
        "task_default_queue": keys.control_queue(),
        "broker_connection_retry_on_startup": True,
        "worker_hijack_root_logger": False,
        "task_time_limit": None,
        "worker_consumer": "tangram_celery.tasks.app:DeadLetterConsumer",
    }


def make_app(settings: Settings, name: str = "tangram") -> Celery:
    """Build a Celery app for ``settings`` with tangram's tasks registered."""
    app = Celery(name, set_as_current=False)
    app.conf.update(celery_config(settings))
    _SETTINGS[app] = settings
    for kind in keys.ACTION_KINDS:
        _register_action_task(app, kind)
    _register_end_trajectory(app)
    return app


def execute_once(
    app: Celery, message: Any, received: float, queue: str = ""
) -> dict[str, Any]:
    """Run an action message through the app's runtime, at most one stored result per id.

    Every result that ran gets the worker's view of its ACT and is appended to the ACT log
    (:mod:`tangram_celery.tasks.actlog`) under ``queue``, the queue it was delivered from.
    """
    runtime = runtime_of(app)
    ledger = _LEDGERS.get(app)
    action_id = message.get("id") if isinstance(message, dict) else None
    if ledger is None or not isinstance(action_id, str) or not ID_PATTERN.fullmatch(action_id):
        return _observed(app, message, runtime.execute(message, received), queue)
    start = claim(ledger, action_id)
    if start.stored is not None:
        log.info("action %s was delivered again; returning its stored result", action_id)
        return start.stored
    try:
        result = runtime.execute(message, received)
    except AlreadyAnswered as answered:
        log.info("action %s was answered while its node was fenced; not run", action_id)
        return answered.result
    result["attempts"] = start.attempt
    return ledger.store(action_id, _observed(app, message, result, queue))


def claim(ledger: Ledger, action_id: str) -> Start:
    """This delivery's claim on ``action_id`` (see :mod:`~tangram_celery.tasks.ledger`), or its
    stored result; while another delivery holds the claim, wait for one or the other."""
    token = uuid.uuid4().hex
    waited = False
    while True:
        start = ledger.begin(action_id, token)
        if not start.holder:
            return start
        if not waited:
            log.warning("action %s is claimed by another delivery (%s); waiting for its "
                        "result instead of running it twice", action_id, start.holder)
            waited = True
        time.sleep(CLAIM_POLL_S)


def _observed(app: Celery, message: Any, result: dict[str, Any], queue: str) -> dict[str, Any]:
    """The worker's view of ``result`` (its stamps on the broker's clock when the app has one),
    appended to the ACT log; a log failure is only logged."""
    clock = _CLOCKS.get(app)
    if clock is not None:
        result = shifted(result, clock.shift_s(), clock.offset())
    viewed = actlog.worker_view(result, message)
    try:
        actlog.append(_acts_client(app), actlog.act_record(viewed, queue))
    except Exception:  # metrics must never fail an action
        log.warning("could not append to the ACT log", exc_info=True)
    return viewed


def _acts_client(app: Celery) -> redis.Redis:
    """The app's Redis connection for the ACT log, made on first use."""
    client = _ACTS_CLIENTS.get(app)
    if client is None:
        settings = _SETTINGS.get(app)
        broker = settings.broker if settings else BrokerSettings(redis_url=app.conf.broker_url)
        client = connect(broker, timeout_s=2.0, retry_s=0)
        _ACTS_CLIENTS[app] = client
    return client


def _register_action_task(app: Celery, kind: str) -> None:
    @app.task(name=keys.task_name(kind), bind=True, acks_late=True)  # type: ignore[untyped-decorator]
    def run_action(self: Task, message: dict[str, Any]) -> dict[str, Any]:
        queue = (self.request.delivery_info or {}).get("routing_key") or ""
        return execute_once(self.app, message, time.time(), str(queue))


def _register_end_trajectory(app: Celery) -> None:
    @app.task(name=END_TRAJECTORY_TASK, bind=True)  # type: ignore[untyped-decorator]
    def end_trajectory(self: Task, trajectory_id: str) -> bool:
        runtime_of(self.app).end_trajectory(trajectory_id)
        return True


STALE_CHANNEL_ERRORS: tuple[type[Exception], ...] = (AttributeError,)
"""What kombu's Redis transport raises when a channel of a connection a broker restart broke is
used again (its ``connection`` is None), treated by tangram's consumer as a connection error."""


def consumer_connection_errors(
    transport_errors: tuple[type[BaseException], ...],
) -> tuple[type[BaseException], ...]:
    """The errors tangram's worker consumer treats as a lost connection: the transport's own,
    and :data:`STALE_CHANNEL_ERRORS`."""
    return (*transport_errors, *STALE_CHANNEL_ERRORS)


class DeadLetterConsumer(Consumer):  # type: ignore[misc]
    """Celery's consumer, with two changes.

    Messages it cannot decode or route are dead-lettered in Redis (``tangram:deadletter``) with
    their reason before being dropped, instead of vanishing. And a failure while closing the
    connection a broker restart just broke (seen with celery 5.7 / kombu 5.7: kombu restores
    unacked messages over the dead connection and ends in ``AttributeError``) no longer kills
    the worker: the connection is dropped and the consumer reconnects as usual. Likewise an
    ack sent, after a reconnect, over the channel of the broken connection (kombu 5.7 raises
    ``AttributeError`` there instead of a connection error) is logged instead of ending the
    worker: the result is already stored, and the message left unacked is redelivered after
    the visibility timeout and answered from the ledger without running again.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.connection_errors = consumer_connection_errors(self.conninfo.connection_errors)

    def on_connection_error_after_connected(self, exc: Exception) -> None:
        try:
            super().on_connection_error_after_connected(exc)
        except Exception:  # closing a dead connection must not end the worker
            log.warning("closing the lost broker connection failed; reconnecting anyway",
                        exc_info=True)
            self.connection = None

    def _dead_letter(self, reason: str, message: Message) -> None:
        ledger = _LEDGERS.get(self.app)
        if ledger is None:
            return
        try:
            ledger.dead_letter(reason, message.body, {
                "content_type": message.content_type,
                "queue": (message.delivery_info or {}).get("routing_key", ""),
                "task": (message.headers or {}).get("task", ""),
                "id": (message.headers or {}).get("id", ""),
            })
        except Exception:  # never let dead-lettering kill the consumer
            log.exception("could not dead-letter a message")

    def on_decode_error(self, message: Message, exc: Exception) -> None:
        self._dead_letter(f"cannot decode: {exc}", message)
        super().on_decode_error(message, exc)

    def on_unknown_message(self, body: Any, message: Message) -> None:
        self._dead_letter("not a task message", message)
        super().on_unknown_message(body, message)

    def on_unknown_task(self, body: Any, message: Message, exc: Exception) -> None:
        self._dead_letter(f"unknown task: {exc}", message)
        super().on_unknown_task(body, message, exc)

    def on_invalid_task(self, body: Any, message: Message, exc: Exception) -> None:
        self._dead_letter(f"invalid task message: {exc}", message)
        super().on_invalid_task(body, message, exc)
