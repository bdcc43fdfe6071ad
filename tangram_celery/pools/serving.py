"""What every pool runtime and pool worker share.

* :func:`rejected_result`: the result of a message that never ran (invalid, or sent to the wrong
  kind of pool), with the same shape as any other result.
* :func:`admission_window`: how many messages a worker holds at once.
* :class:`Heartbeat`: a periodic call on a daemon thread (registration refreshes).
* :func:`serve`: run a Celery worker on one queue with a runtime attached (and the result
  ledger), starting the runtime when the worker is ready and stopping it at shutdown.

CPU nodes (:mod:`tangram_celery.pools.cpu_pool.worker`) and GPU pools
(:mod:`tangram_celery.pools.gpu_pool`) use them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from celery.signals import worker_ready, worker_shutdown

from tangram_celery.action import ActionResult, Timings
from tangram_celery.connection import connect
from tangram_celery.settings import NodeSettings, Settings
from tangram_celery.tasks.app import Runtime, attach_runtime, make_app
from tangram_celery.tasks.clock import BrokerClock
from tangram_celery.tasks.ledger import Ledger

log = logging.getLogger(__name__)


class PoolRuntime(Runtime, Protocol):
    """A runtime with a lifetime: started when its worker is ready, stopped at shutdown."""

    def start(self) -> None:
        """Begin serving (register, start heartbeats, check services)."""

    def stop(self) -> None:
        """Stop serving and free what the runtime holds."""


def rejected_result(
    message: Mapping[str, Any] | Any, reason: str, node: str, received: float,
    status: str = "rejected",
) -> dict[str, Any]:
    """The ``rejected`` (or other ``status``) result of a message that did not run, as the JSON
    a task returns.

    Ids and kind are copied from the message when it has them (bounded in size), so the client
    still gets an answer for whatever it sent.
    """
    data = message if isinstance(message, Mapping) else {}
    result = ActionResult(
        action_id=str(data.get("id", ""))[:128],
        trajectory_id=str(data.get("trajectory_id", ""))[:128],
        kind=str(data.get("kind", ""))[:32],
        status=status,
        node=node,
        timings=Timings(received=received, stored=time.time()),
        error=reason,
    )
    return result.to_json()


def admission_window(node: NodeSettings, units: int, concurrency: int | None = None) -> int:
    """Messages a worker holds at once: ``concurrency``, else ``TANGRAM_ADMISSION_WINDOW``, else
    ``max(2 * units, units + 4)`` (enough to keep every unit busy and see who waits next)."""
    return concurrency or node.admission_window or max(2 * units, units + 4)


class Heartbeat:
    """Calls ``beat`` every ``period_s`` seconds on a daemon thread between :meth:`start` and
    :meth:`stop`; a failing beat is logged and the next one tried (it never stops the worker)."""

    def __init__(self, name: str, period_s: float, beat: Callable[[], None]) -> None:
        self.name = name
        self.period_s = period_s
        self.beat = beat
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start beating (the first beat comes after one period)."""
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop beating and wait up to ``timeout`` seconds for the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.beat()
            except Exception:  # a missed beat is retried on the next one
                log.warning("%s failed", self.name, exc_info=True)


def serve(
    settings: Settings,
    runtime: PoolRuntime,
    queue: str,
    nodename: str,
    window: int,
    loglevel: str = "INFO",
    ready_message: str = "",
) -> None:
    """Run a Celery worker consuming ``queue`` in this process until it is told to stop.

    The worker uses the threads pool with ``window`` threads, sends task events (``-E``) for
    Flower, and executes through ``runtime`` with the result ledger attached (exactly-once
    results). ``nodename`` is Celery's node name (``%h`` expands to the host name).
    """
    app = make_app(settings)
    client = connect(settings.broker)
    attach_runtime(app, runtime, Ledger(client, settings.broker.result_ttl_s,
                                       settings.visibility_timeout_s),
                   BrokerClock(client, settings.broker.clock_skew_s))

    def on_ready(**_: Any) -> None:
        runtime.start()
        log.info("%s", ready_message or f"worker {nodename} ready on {queue}, window {window}")

    def on_shutdown(**_: Any) -> None:
        runtime.stop()

    worker_ready.connect(on_ready, weak=False)
    worker_shutdown.connect(on_shutdown, weak=False)
    app.worker_main([
        "worker", "-Q", queue, "-P", "threads", "-c", str(window), "-n", nodename, "-E",
        "--without-mingle", "--without-gossip", "-l", loglevel,
    ])
