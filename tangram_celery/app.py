"""The Celery app factory and tangram's tasks.

``make_app(settings)`` builds a configured app (JSON only, acks late, FCFS-friendly prefetch) and
registers one task per action kind, so Flower shows readable names. Tasks are thin: they hand the
message to the runtime attached to the worker's app (a :class:`~tangram_celery.node.CpuNode` or a
GPU/API pool runtime). Nothing connects at import time or in the factory.
"""

from __future__ import annotations

import time
import weakref
from typing import Any, Protocol

from celery import Celery, Task

from tangram_celery import keys
from tangram_celery.errors import ServiceError
from tangram_celery.settings import Settings

END_TRAJECTORY_TASK = "tangram.control.end_trajectory"


class Runtime(Protocol):
    """What a worker process plugs into its app to execute tangram's tasks."""

    def execute(self, message: dict[str, Any], received: float) -> dict[str, Any]:
        """Run one action message; returns the result as JSON."""

    def end_trajectory(self, trajectory_id: str) -> None:
        """Free a trajectory's environment on this worker."""


_RUNTIMES: weakref.WeakKeyDictionary[Celery, Runtime] = weakref.WeakKeyDictionary()


def attach_runtime(app: Celery, runtime: Runtime) -> None:
    """Make ``runtime`` execute the tasks this app's worker receives."""
    _RUNTIMES[app] = runtime


def runtime_of(app: Celery) -> Runtime:
    """The runtime attached to ``app``; a clear error in a process that is not a tangram worker."""
    try:
        return _RUNTIMES[app]
    except KeyError:
        raise ServiceError(
            "this process has no tangram runtime: start workers with `tangram worker cpu ...`"
        ) from None


def celery_config(settings: Settings) -> dict[str, Any]:
    """The Celery configuration tangram relies on (see FIELD-NOTES for the reasons)."""
    return {
        "broker_url": settings.redis_url,
        "result_backend": settings.result_backend_url,
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
        },
        "result_backend_transport_options": {"retry_policy": {"timeout": 5.0}},
        "result_expires": settings.result_ttl_s,
        "task_send_sent_event": True,
        "worker_send_task_events": True,
        "task_default_queue": keys.control_queue(),
        "broker_connection_retry_on_startup": True,
        "worker_hijack_root_logger": False,
        "task_time_limit": None,
    }


def make_app(settings: Settings, name: str = "tangram") -> Celery:
    """Build a Celery app for ``settings`` with tangram's tasks registered."""
    app = Celery(name, set_as_current=False)
    app.conf.update(celery_config(settings))
    for kind in keys.ACTION_KINDS:
        _register_action_task(app, kind)
    _register_end_trajectory(app)
    return app


def _register_action_task(app: Celery, kind: str) -> None:
    @app.task(name=keys.task_name(kind), bind=True, acks_late=True)  # type: ignore[untyped-decorator]
    def run_action(self: Task, message: dict[str, Any]) -> dict[str, Any]:
        return runtime_of(self.app).execute(message, time.time())


def _register_end_trajectory(app: Celery) -> None:
    @app.task(name=END_TRAJECTORY_TASK, bind=True)  # type: ignore[untyped-decorator]
    def end_trajectory(self: Task, trajectory_id: str) -> bool:
        runtime_of(self.app).end_trajectory(trajectory_id)
        return True
