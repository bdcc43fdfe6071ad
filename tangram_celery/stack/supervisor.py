"""The supervisor of a local stack: the service processes of ``tangram up`` and their state.

:class:`LocalStack` starts the services of a plan in order (each once its dependencies meet
their conditions, one with a healthcheck waited for by running it), watches them (exits and
health changes reported, restarts per their ``restart`` policy with a growing backoff), stops
them in reverse order, process group and all, and records itself and them in ``stack.json``.
A process is named by its pid and start time, so a reused pid is never mistaken for it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tangram_celery.errors import ServiceError
from tangram_celery.processes import stop_process
from tangram_celery.stack.local_service import LOCAL_HOST, LocalService

STATE_FILE = "stack.json"
RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)


def process_start_time(pid: int) -> int | None:
    """The start time (clock ticks since boot) of process ``pid``; None when it is gone or a
    zombie. With the pid it names one process, even after the pid is reused."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def alive(pid: int, start_time: int | None) -> bool:
    """Whether the process recorded as (``pid``, ``start_time``) still runs."""
    now = process_start_time(pid)
    return now is not None and (start_time is None or now == start_time)


def group_members(pgid: int) -> list[int]:
    """Live processes in process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def kill_group(pgid: int) -> None:
    """SIGKILL what is left of process group ``pgid``."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)



@dataclass
class Running:
    """One service process and what is known about it."""

    spec: LocalService
    process: subprocess.Popen[bytes] | None = None
    start_time: int | None = None
    state: str = "created"
    restarts: int = 0
    exited_at: float = 0.0
    next_check: float = 0.0
    failures: int = 0

    def record(self, log: Path) -> dict[str, Any]:
        """Its entry in ``stack.json``."""
        pid = self.process.pid if self.process else None
        return {"pid": pid, "start_time": self.start_time, "state": self.state,
                "log": str(log), "ports": {str(k): v for k, v in self.spec.ports.items()}}


@dataclass
class LocalStack:
    """Starts, watches and stops the local processes of a
    :func:`~tangram_celery.stack.local_service.localize` plan."""

    services: Mapping[str, LocalService]
    order: Sequence[str]
    state_dir: Path
    environment: Mapping[str, str]
    announce: Callable[[str], None] = print
    running: dict[str, Running] = field(default_factory=dict)
    ready: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def log_path(self, name: str) -> Path:
        """Where service ``name`` writes its output."""
        return self.state_dir / "logs" / f"{name}.log"

    def start(self, stop: threading.Event) -> None:
        """Start every service in order, each once its dependencies meet their conditions.
        Raises :class:`ServiceError` when one exits or stays unhealthy."""
        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        for name in self.order:
            if stop.is_set():
                return
            spec = self.services[name]
            for dependency, condition in spec.depends_on.items():
                self._wait_condition(dependency, condition, stop)
            self.running[name] = Running(spec)
            self._spawn(self.running[name])
            self.write_state()
            self._wait_started(self.running[name], stop)
            self.write_state()
        self.ready = True
        self.write_state()

    def _spawn(self, entry: Running) -> None:
        log = self.log_path(entry.spec.name)
        with open(log, "ab") as out:
            out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} tangram up starts "
                      f"{' '.join(entry.spec.argv)}\n".encode())
            out.flush()
            entry.process = subprocess.Popen(
                list(entry.spec.argv), stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
                env={**self.environment, **entry.spec.environment},
            )
        entry.start_time = process_start_time(entry.process.pid)
        entry.state = "starting" if entry.spec.healthcheck else "running"
        entry.failures = 0
        entry.next_check = time.monotonic()
        self.announce(f"{entry.spec.name}: started (pid {entry.process.pid})")

    def _wait_started(self, entry: Running, stop: threading.Event) -> None:
        check = entry.spec.healthcheck
        if check is None:
            stop.wait(0.2)
            self._raise_if_exited(entry)
            return
        deadline = time.monotonic() + check.deadline_s
        while not stop.is_set():
            self._raise_if_exited(entry)
            if self.healthy(entry):
                entry.state = "healthy"
                self.announce(f"{entry.spec.name}: healthy")
                return
            if time.monotonic() > deadline:
                raise ServiceError(f"{entry.spec.name} did not become healthy within "
                                   f"{check.deadline_s:.0f} s; see "
                                   f"{self.log_path(entry.spec.name)}")
            stop.wait(min(check.interval_s, 0.5))

    def _raise_if_exited(self, entry: Running) -> None:
        if entry.process is not None and entry.process.poll() is not None:
            entry.state = f"exited ({entry.process.returncode})"
            raise ServiceError(f"{entry.spec.name} exited with {entry.process.returncode} at "
                               f"start; see {self.log_path(entry.spec.name)}:\n"
                               f"{self.log_tail(entry.spec.name)}")

    def _wait_condition(self, name: str, condition: str, stop: threading.Event) -> None:
        entry = self.running.get(name)
        if entry is None:
            raise ServiceError(f"{name} was not started")
        if condition == "service_completed_successfully":
            while entry.process is not None and entry.process.poll() is None:
                if stop.wait(0.2):
                    return
            if entry.process is not None and entry.process.returncode != 0:
                raise ServiceError(f"{name} did not complete successfully")

    def healthy(self, entry: Running) -> bool:
        """Run the service's healthcheck command once."""
        check = entry.spec.healthcheck
        if check is None:
            return entry.process is not None and entry.process.poll() is None
        try:
            done = subprocess.run(list(check.test), stdin=subprocess.DEVNULL,
                                  capture_output=True, timeout=check.timeout_s, check=False,
                                  env={**self.environment, **entry.spec.environment})
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0

    def log_tail(self, name: str, chars: int = 2000) -> str:
        """The end of a service's log."""
        try:
            return self.log_path(name).read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def watch(self, stop: threading.Event) -> None:
        """Until ``stop``: report exits and health changes, restart per the restart policy."""
        while not stop.wait(0.5):
            now = time.monotonic()
            for entry in list(self.running.values()):
                self._watch_one(entry, now)
            self.write_state()

    def _watch_one(self, entry: Running, now: float) -> None:
        process, name = entry.process, entry.spec.name
        if process is None:
            return
        if process.poll() is not None:
            if not entry.state.startswith("exited"):
                entry.state = f"exited ({process.returncode})"
                entry.exited_at = now
                kill_group(process.pid)
                self.announce(f"{name}: exited with {process.returncode}; see "
                              f"{self.log_path(name)}")
            policy = entry.spec.restart
            if policy in ("always", "unless-stopped") or (
                    policy.startswith("on-failure") and process.returncode != 0):
                backoff = RESTART_BACKOFF_S[min(entry.restarts, len(RESTART_BACKOFF_S) - 1)]
                if now - entry.exited_at >= backoff:
                    entry.restarts += 1
                    self._spawn(entry)
            return
        check = entry.spec.healthcheck
        if check is None or now < entry.next_check:
            return
        entry.next_check = now + check.interval_s
        if self.healthy(entry):
            if entry.state != "healthy":
                self.announce(f"{name}: healthy")
            entry.state, entry.failures = "healthy", 0
            return
        entry.failures += 1
        if entry.failures >= check.retries and entry.state != "unhealthy":
            entry.state = "unhealthy"
            self.announce(f"{name}: unhealthy ({entry.failures} failed checks)")

    def stop(self) -> None:
        """Stop every service, dependents first: SIGTERM, its grace period, SIGKILL; then
        SIGKILL whatever is left in its process group."""
        with self._lock:
            for name in reversed(list(self.running)):
                entry = self.running[name]
                process = entry.process
                if process is None:
                    continue
                if process.poll() is None:
                    self.announce(f"{name}: stopping")
                stop_process(process, timeout=entry.spec.stop_grace_s)
                kill_group(process.pid)
                entry.state = "stopped"
            self.write_state()

    def status_rows(self) -> list[tuple[str, str, str, str, str]]:
        """(service, state, pid, ports, log) per service."""
        rows = []
        for name, entry in self.running.items():
            pid = str(entry.process.pid) if entry.process else "-"
            ports = ", ".join(f"{LOCAL_HOST}:{p}" for p in sorted(set(entry.spec.ports.values())))
            rows.append((name, entry.state + (f", {entry.restarts} restarts"
                                              if entry.restarts else ""),
                         pid, ports or "-", str(self.log_path(name))))
        return rows

    def write_state(self) -> None:
        """Write ``stack.json`` (atomically)."""
        state = {
            "supervisor": {"pid": os.getpid(), "start_time": process_start_time(os.getpid())},
            "ready": self.ready,
            "services": {name: entry.record(self.log_path(name))
                         for name, entry in self.running.items()},
        }
        path = self.state_dir / STATE_FILE
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(state, indent=2))
        partial.replace(path)


def render_status(rows: Sequence[tuple[str, str, str, str, str]]) -> str:
    """The status table as text."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="tangram up", title_justify="left")
    for column in ("service", "state", "pid", "listens on", "log"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*row)
    console = Console(width=160, record=True, force_terminal=False)
    with console.capture() as captured:
        console.print(table)
    return captured.get()


def running_supervisor(state_dir: Path) -> dict[str, Any] | None:
    """The state of a ``tangram up`` still running on ``state_dir``, else None."""
    try:
        state = json.loads((state_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    supervisor = state.get("supervisor") or {}
    if supervisor.get("pid") and alive(int(supervisor["pid"]), supervisor.get("start_time")):
        return dict(state)
    return None


@contextlib.contextmanager
def watching(stack: LocalStack, stop: threading.Event) -> Iterator[None]:
    """Run :meth:`LocalStack.watch` in a thread (exits reported, restart policies applied)
    while the block runs; then set ``stop`` and wait for the thread."""
    thread = threading.Thread(target=stack.watch, args=(stop,), name="tangram-stack-watch",
                              daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
