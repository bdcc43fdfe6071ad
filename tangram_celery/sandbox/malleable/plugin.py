"""The pytest plugin of the malleable runner (``-p tangram_celery.sandbox.malleable.plugin``).

``--malleable=N`` makes the session a controller with N workers; a worker is the same plugin in
a session started with ``--malleable-connect=ADDRESS``. Without either option (or with
``--collect-only``) it does nothing.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from tangram_celery.sandbox.malleable.controller import Controller
from tangram_celery.sandbox.malleable.pool import worker_args
from tangram_celery.sandbox.malleable.worker import WorkerPlugin


def pytest_addoption(parser: pytest.Parser) -> None:
    """The runner's options."""
    group = parser.getgroup("malleable", "malleable test runs (tangram)")
    group.addoption("--malleable", type=int, default=None, metavar="N",
                    help="run the tests on N worker processes that can be added and retired")
    group.addoption("--malleable-control", default=None, metavar="PATH",
                    help="the Unix socket to listen on for workers and grow/shrink requests")
    group.addoption("--malleable-stats", default=None, metavar="PATH",
                    help="write the run's worker start times and resizes there as JSON")
    group.addoption("--malleable-connect", default=None,
                    help="(set by the runner) the controller a worker connects to")


def pytest_configure(config: pytest.Config) -> None:
    """Register the controller's or the worker's side."""
    address = config.getoption("malleable_connect")
    if address:
        config.pluginmanager.register(WorkerPlugin(config, str(address)), "malleable-worker")
        return
    workers = config.getoption("malleable")
    if workers is None or config.option.collectonly:
        return
    if workers < 1:
        raise pytest.UsageError(f"--malleable needs at least 1 worker, got {workers}")
    config.pluginmanager.register(ControllerPlugin(config, workers), "malleable-controller")


class ControllerPlugin:
    """The controller's side: no collection of its own, the workers' tests replayed."""

    def __init__(self, config: pytest.Config, workers: int) -> None:
        self.config = config
        self.workers = workers
        self.controller: Controller | None = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection(self, session: pytest.Session) -> bool:
        """The workers collect; the controller does not."""
        return True

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        """Run the tests on the workers, then stop as a plain run would."""
        scratch = Path(tempfile.mkdtemp(prefix="tangram-malleable-"))
        address = self.config.getoption("malleable_control") or str(scratch / "control.sock")
        controller = Controller(session, self.workers, str(address),
                                worker_args(self.config.invocation_params.args), scratch)
        self.controller = controller
        try:
            controller.run()
        finally:
            self._write_stats(controller)
            shutil.rmtree(scratch, ignore_errors=True)
            if address != str(scratch / "control.sock"):
                Path(address).unlink(missing_ok=True)
        if controller.startup_failed:
            raise pytest.UsageError("malleable: the worker processes could not start "
                                    "(their stderr is above)")
        if controller.stopping and controller.queue is not None and not (
                session.shouldfail or session.shouldstop):
            raise session.Interrupted(controller.stopping)
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)
        return True

    def _write_stats(self, controller: Controller) -> None:
        path = self.config.getoption("malleable_stats")
        if not path:
            return
        workers = [{
            "pid": w.pid, "tests": w.tests,
            "collect_s": None if w.collected is None else w.collected - w.started,
            "start_at_s": w.started - controller.began,
            "end_at_s": None if w.ended is None else w.ended - controller.began,
            "last_done_at_s": None if w.last_done is None else w.last_done - controller.began,
        } for w in controller.workers]
        Path(path).write_text(json.dumps({
            "tests": len(controller.ids), "done": controller.done, "workers": workers,
            "resizes": controller.resizes, "wall_s": time.monotonic() - controller.began,
        }, indent=1))
