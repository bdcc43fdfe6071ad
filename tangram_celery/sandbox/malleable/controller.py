"""The controller of a malleable test run: one event loop that starts workers, hands out test ids
from one queue, replays every report into its own pytest session (whose terminal reporter then
prints the failures and the summary line, and whose exit status is pytest's own) and resizes the
run when told to.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import time
import warnings
from collections import deque
from pathlib import Path
from typing import Any

import pytest

from tangram_celery.sandbox.malleable.pool import Worker, spawn
from tangram_celery.sandbox.malleable.protocol import Channel, Message

STARTUP_FAILURES = 3
"""How many workers may die before collecting, or collect other tests than the first, before
the run gives up."""
TICK_S = 0.1
"""How often the loop looks at worker processes when no message arrives."""


def rebuild_warning(message: Message) -> warnings.WarningMessage:
    """A recorded warning from its plain data (an unknown category becomes a subclass of
    :class:`Warning` of the same name)."""
    name = str(message["category"])
    found = getattr(__builtins__, name, None) if not isinstance(__builtins__, dict) \
        else __builtins__.get(name)
    category = found if isinstance(found, type) and issubclass(found, Warning) \
        else type(name, (Warning,), {})
    return warnings.WarningMessage(message=category(message["message"]), category=category,
                                   filename=str(message["filename"]),
                                   lineno=int(message["lineno"]))


class Deselected:
    """What stands for a test a worker deselected in the controller's statistics."""

    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid


class Controller:
    """Runs one session's tests on ``workers`` worker processes that can come and go.

    ``address`` is the Unix socket workers and the node connect to; ``args`` the pytest
    arguments each worker gets; ``scratch`` a directory for the workers' stderr.
    """

    def __init__(self, session: pytest.Session, workers: int, address: str, args: list[str],
                 scratch: Path) -> None:
        self.session = session
        self.config = session.config
        self.target = workers
        self.address = address
        self.args = args
        self.scratch = scratch
        self.cwd = Path(self.config.invocation_params.dir)
        self.workers: list[Worker] = []
        self.by_pid: dict[int, Worker] = {}
        self.queue: deque[str] | None = None
        self.ids: list[str] = []
        self.done = 0
        self.stopping: str | None = None
        self.startup_failures = 0
        self.startup_failed = False
        self.resizes: list[dict[str, Any]] = []
        self.began = time.monotonic()
        self.selector = selectors.DefaultSelector()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

    def run(self) -> None:
        """Start the workers and serve them until every worker is gone."""
        self.listener.bind(self.address)
        self.listener.listen(64)
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        try:
            for _ in range(self.target):
                self._start()
            while any(w.state != "gone" for w in self.workers):
                for key, _ in self.selector.select(TICK_S):
                    if key.data is None:
                        self._accept()
                    else:
                        self._read(key.data)
                self._reap()
                self._replenish()
        finally:
            for worker in self.workers:
                if worker.proc.poll() is None:
                    worker.proc.kill()
                    worker.proc.wait()
            self.selector.close()
            self.listener.close()

    def _start(self) -> None:
        worker = spawn(len(self.workers), self.address, self.args, self.cwd, self.scratch)
        self.workers.append(worker)
        self.by_pid[worker.pid] = worker

    def _accept(self) -> None:
        sock, _ = self.listener.accept()
        sock.setblocking(True)
        channel = Channel(sock)
        self.selector.register(sock, selectors.EVENT_READ, channel)

    def _read(self, channel: Channel) -> None:
        try:
            messages, closed = channel.feed()
        except (OSError, ValueError):
            messages, closed = [], True
        worker = next((w for w in self.workers if w.channel is channel), None)
        for message in messages:
            if message.get("op") == "hello" and message.get("role") == "worker":
                worker = self.by_pid.get(int(message.get("pid", -1)))
                if worker is None:
                    closed = True
                    break
                worker.channel = channel
            elif worker is not None:
                self._from_worker(worker, message)
            else:
                self._control(channel, message)
        if closed:
            self.selector.unregister(channel.sock)
            channel.close()
            if worker is not None:
                worker.closed = True

    def _from_worker(self, worker: Worker, message: Message) -> None:
        op = message.get("op")
        hook = self.config.hook
        if op == "collected":
            self._collected(worker, message)
        elif op == "next":
            self._reply(worker, {"id": self._hand_out(worker)})
        elif op == "logstart":
            worker.running, worker.location = message["nodeid"], tuple(message["location"])
            hook.pytest_runtest_logstart(nodeid=message["nodeid"],
                                         location=tuple(message["location"]))
        elif op == "report":
            hook.pytest_runtest_logreport(report=self._report(message["report"]))
            self._check_stop()
        elif op == "warning":
            self._warning(message)
        elif op == "logfinish":
            worker.running = None
            hook.pytest_runtest_logfinish(nodeid=message["nodeid"],
                                          location=tuple(message["location"]))
        elif op == "done":
            if message["id"] in worker.held:
                worker.held.remove(message["id"])
            self.done += 1
            worker.tests += 1
            worker.last_done = time.monotonic()
            if worker.state == "retiring" or self.stopping:
                self._reply(worker, {"retire": True})
            else:
                handed = self._hand_out(worker) if message.get("next") else None
                self._reply(worker, {"retire": False, "id": handed})
        elif op == "return" and message["id"] in worker.held:
            worker.held.remove(message["id"])
            if self.queue is not None:
                self.queue.appendleft(message["id"])

    def _report(self, data: Message) -> pytest.TestReport | pytest.CollectReport:
        """A report from its serialised form, with the tuples JSON made lists (a skip's
        ``longrepr``, a test's ``location``) tuples again, as pytest's summary expects."""
        report: pytest.TestReport | pytest.CollectReport = \
            self.config.hook.pytest_report_from_serializable(config=self.config, data=data)
        if isinstance(report.longrepr, list):
            report.longrepr = tuple(report.longrepr)
        if isinstance(report, pytest.TestReport) and isinstance(report.location, list):
            report.location = tuple(report.location)
        return report

    def _reply(self, worker: Worker, message: Message) -> None:
        if worker.channel is not None:
            try:
                worker.channel.send(message)
            except OSError:
                worker.closed = True

    def _hand_out(self, worker: Worker) -> str | None:
        if self.queue is None or self.stopping or worker.state != "running":
            return None
        if not self.queue:
            worker.state = "drained"
            return None
        found = self.queue.popleft()
        worker.held.append(found)
        return found

    def _collected(self, worker: Worker, message: Message) -> None:
        worker.collected = time.monotonic()
        if worker.state != "starting":
            return
        ids = [str(i) for i in message["ids"]]
        if self.queue is not None:
            if sorted(ids) == sorted(self.ids):
                worker.state = "running"
                return
            worker.state = "retiring"
            self._line(f"malleable: worker {worker.pid} collected other tests; it stops")
            self.startup_failures += 1
            if self.startup_failures >= STARTUP_FAILURES:
                self.stopping = self.stopping or "malleable: workers collect different tests"
            return
        worker.state = "running"
        self.ids = ids
        self.queue = deque(ids)
        hook = self.config.hook
        for data in message["reports"]:
            hook.pytest_collectreport(report=self._report(data))
        for data in message["warnings"]:
            self._warning(data)
        if message["deselected"]:
            hook.pytest_deselected(items=[Deselected(str(i)) for i in message["deselected"]])
        self.session.testscollected = len(ids)
        if self.session.testsfailed and not self.config.option.continue_on_collection_errors:
            errors = self.session.testsfailed
            self.stopping = f"{errors} error{'s' if errors != 1 else ''} during collection"
            self.queue.clear()

    def _warning(self, message: Message) -> None:
        self.config.hook.pytest_warning_recorded.call_historic(kwargs={
            "warning_message": rebuild_warning(message), "when": message["when"],
            "nodeid": message["nodeid"], "location": None})

    def _check_stop(self) -> None:
        if not self.stopping and (self.session.shouldfail or self.session.shouldstop):
            self.stopping = str(self.session.shouldfail or self.session.shouldstop)

    def _control(self, channel: Channel, message: Message) -> None:
        op = message.get("op")
        if op == "grow":
            answer = self.grow()
        elif op == "shrink":
            answer = self.shrink()
        else:
            answer = self.status()
        with contextlib.suppress(OSError):
            channel.send(answer)

    def grow(self) -> Message:
        """Add a worker (the node grew the action's cpuset before it asked)."""
        self.target += 1
        self._resized("grow", None)
        self._start()
        return {**self.status(), "ok": True}

    def shrink(self) -> Message:
        """Take one worker away at once: one not yet collecting is killed, else the newest
        running one retires after its current test."""
        candidates = [w for w in self.workers if w.active]
        if self.target <= 1 or len(candidates) <= 1:
            return {**self.status(), "ok": False, "reason": "a run keeps at least one worker"}
        starting = [w for w in candidates if w.state == "starting"]
        chosen = starting[-1] if starting else candidates[-1]
        self.target -= 1
        if chosen.state == "starting":
            chosen.proc.kill()
            chosen.state = "drained"
        else:
            chosen.state = "retiring"
        self._resized("shrink", chosen.pid)
        return {**self.status(), "ok": True, "retiring": chosen.pid}

    def _resized(self, kind: str, pid: int | None) -> None:
        self.resizes.append({"kind": kind, "at_s": time.monotonic() - self.began,
                             "workers": self.target, "done": self.done, "pid": pid})

    def status(self) -> Message:
        """The run's state as plain data: worker count, tests in all, done and queued."""
        return {"workers": self.target, "active": sum(w.active for w in self.workers),
                "pids": [w.pid for w in self.workers if w.state != "gone"],
                "tests": len(self.ids), "done": self.done,
                "queued": len(self.queue) if self.queue is not None else None,
                "collected": self.queue is not None}

    def _reap(self) -> None:
        for worker in self.workers:
            if worker.state == "gone" or worker.proc.poll() is None:
                continue
            if worker.channel is not None and not worker.closed:
                continue
            self._gone(worker)

    def _gone(self, worker: Worker) -> None:
        worker.ended = time.monotonic()
        killed = worker.state == "drained" and worker.collected is None
        worker.state = "gone"
        code = worker.proc.returncode
        if worker.collected is None and not killed:
            self.startup_failures += 1
            self._line(f"malleable: worker {worker.pid} exited ({code}) before collecting:\n"
                       + worker.stderr_text())
            if self.startup_failures >= STARTUP_FAILURES or (self.queue is None and all(
                    w.state == "gone" for w in self.workers)):
                self.stopping = self.stopping or "malleable: workers could not start"
                self.startup_failed = True
        if worker.running is not None:
            self._crashed(worker, worker.running, code)
        if self.queue is not None:
            self.queue.extendleft(reversed([i for i in worker.held if i != worker.running]))
        worker.held.clear()
        worker.running = None

    def _crashed(self, worker: Worker, nodeid: str, code: int | None) -> None:
        location = worker.location or (nodeid.split("::")[0], None, nodeid)
        report = pytest.TestReport(
            nodeid=nodeid, location=location, keywords={}, outcome="failed", when="call",
            longrepr=f"worker {worker.pid} crashed running this test (exit status {code})\n"
                     + worker.stderr_text())
        self.config.hook.pytest_runtest_logreport(report=report)
        self.config.hook.pytest_runtest_logfinish(nodeid=nodeid, location=location)
        self.done += 1
        self._check_stop()

    def _replenish(self) -> None:
        if self.stopping or not self.queue:
            return
        while sum(w.active for w in self.workers) < self.target:
            self._start()

    def _line(self, text: str) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(text)
