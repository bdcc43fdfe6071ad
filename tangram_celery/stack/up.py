"""``tangram up`` and ``tangram down``: the compose stack as local processes, without Docker.

``tangram up`` reads ``compose/docker-compose.yml`` (:mod:`tangram_celery.stack.compose`) and runs
its services' own commands here: ``tangram redis`` (the embedded Redis, AOF in a local volume
directory), ``tangram triton`` (the pytriton ``tritonserver`` binary on ``triton_models/``),
``tangram flower`` and the workers. Services start in dependency order; one with a healthcheck
is waited for by running its healthcheck command, as Docker would; the host ports are the ones
the compose file publishes, so a client uses the same ``TANGRAM_REDIS_URL`` with either. It
prints a status table, keeps the services running (restarting those whose ``restart`` policy
says so), and stops them all, in reverse order, on Ctrl-C, SIGTERM or ``tangram down``.

The state directory (``--state-dir``) holds ``stack.json`` (the supervisor's and the services'
process ids, for ``tangram down``), ``client.env`` (the ``TANGRAM_`` settings a client on this
host needs, mode 0600), ``secrets.env`` (passwords generated when the env file sets none,
mode 0600), ``logs/<service>.log`` and ``volumes/<name>/``.

Local differences from the containers, all explicit: the sandbox backend is ``--sandbox``
(default ``bwrap``, the embedded one) through ``STACK_SANDBOX_BACKEND``; missing passwords are
generated; a service whose image is not tangram's (Prometheus) is skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tangram_celery.errors import ConfigError, ServiceError
from tangram_celery.processes import free_port, stop_process
from tangram_celery.stack.compose import (
    DEFAULT_COMPOSE_FILE,
    ComposeFile,
    load_compose,
    read_env_file,
    selected_services,
)
from tangram_celery.stack.local_service import LOCAL_HOST, LocalService, host_ports, localize

DEFAULT_STATE_DIR = Path.home() / ".local" / "state" / "tangram" / "up"
STATE_FILE = "stack.json"
CLIENT_SETTINGS = ("TANGRAM_REDIS_URL", "TANGRAM_RESULT_URL", "TANGRAM_TRITON_URL")
GENERATED_SECRETS = ("STACK_REDIS_PASSWORD", "TANGRAM_FLOWER_PASSWORD")
DOWN_TIMEOUT_S = 180.0
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


def port_is_free(port: int, host: str = LOCAL_HOST) -> bool:
    """Whether ``host:port`` can be listened on now."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def is_ours(image: str) -> bool:
    """Whether a service runs tangram's image (so its command is one of ours)."""
    return image.startswith("tangram:") or image.split("/")[-1].startswith("tangram:")


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
    """Starts, watches and stops the local processes of a :func:`localize` plan."""

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


def write_private(path: Path, values: Mapping[str, str]) -> None:
    """Write ``KEY=VALUE`` lines readable by the owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.writelines(f"{key}={value}\n" for key, value in values.items())


def stack_variables(
    environ: Mapping[str, str], env_file: Mapping[str, str], secrets_path: Path, sandbox: str,
) -> dict[str, str]:
    """The interpolation variables of ``tangram up``: the env file, then the environment over
    it (compose's precedence), the sandbox backend, and passwords generated (and kept in
    ``secrets_path``) for those still unset."""
    variables = {**env_file, **environ, "STACK_SANDBOX_BACKEND": sandbox}
    kept = read_env_file(secrets_path)
    missing = {name: kept.get(name) or secrets.token_urlsafe(24)
               for name in GENERATED_SECRETS if not variables.get(name)}
    if missing:
        write_private(secrets_path, {**kept, **missing})
    return {**variables, **missing}


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


@dataclass(frozen=True)
class UpOptions:
    """What ``tangram up`` runs (see :func:`add_up_arguments`).

    ``publish=False``: every port a service listens on is a free loopback port instead of the
    host port the compose file publishes (a private stack beside another one). ``replicas``:
    service -> one mapping of interpolation variables per copy to run; copy ``i`` (from 1) is
    named ``SERVICE-i`` and its command is read from the compose file with those variables
    over the others (how ``tangram demo`` runs several CPU nodes from one ``cpu-node``)."""

    compose_file: Path = DEFAULT_COMPOSE_FILE
    env_file: Path | None = None
    state_dir: Path = DEFAULT_STATE_DIR
    services: tuple[str, ...] = ()
    profiles: tuple[str, ...] = ()
    sandbox: str = "bwrap"
    publish: bool = True
    replicas: Mapping[str, Sequence[Mapping[str, str]]] = field(default_factory=dict)


def plan(options: UpOptions, environ: Mapping[str, str]
         ) -> tuple[ComposeFile, dict[str, LocalService], list[str], dict[str, str]]:
    """Read the compose file for ``options``: (compose file, local services in start order,
    skipped services, the environment every process starts with)."""
    env_path = options.env_file or options.compose_file.parent / ".env"
    env_file = read_env_file(env_path)
    variables = stack_variables(environ, env_file, options.state_dir / "secrets.env",
                                options.sandbox)
    compose = load_compose(options.compose_file, variables)
    order = selected_services(compose, options.services, options.profiles)
    skipped = [n for n in order if not is_ours(compose.services[n].image)]
    order = [n for n in order if n not in skipped]
    ports = host_ports(compose, order)
    if not options.publish:
        ports = {key: free_port() for key in ports}
    taken = [f"{svc}:{port} -> {LOCAL_HOST}:{host}" for (svc, port), host in ports.items()
             if not port_is_free(host)]
    if taken:
        raise ConfigError("ports in use: " + "; ".join(taken) + " (stop what listens there, "
                          "or choose other ports with the STACK_*_PORT variables)")
    local = localize(compose, order, ports, options.state_dir / "volumes")
    local = {name: local[name] for name in order}
    for name, copies in options.replicas.items():
        local = replicate(local, name, [
            localize(load_compose(options.compose_file, {**variables, **extra}), [name], ports,
                     options.state_dir / "volumes")[name]
            for extra in copies
        ])
    base_env = {**environ, **env_file, **{k: variables[k] for k in GENERATED_SECRETS}}
    return compose, local, skipped, base_env


def replicate(services: Mapping[str, LocalService], name: str,
              copies: Sequence[LocalService]) -> dict[str, LocalService]:
    """``services`` with ``name`` replaced, in place, by ``copies`` named ``NAME-1``, ``NAME-2``
    ...; a service that depends on ``name`` depends on every copy. Raises :class:`ConfigError`
    when ``name`` is not started or listens on ports (its copies would share them)."""
    if name not in services:
        raise ConfigError(f"cannot run copies of {name!r}: it is not among the services "
                          f"started ({', '.join(services)})")
    if services[name].ports:
        raise ConfigError(f"cannot run copies of {name!r}: it listens on ports")
    if not copies:
        raise ConfigError(f"{name!r}: at least one copy is needed")
    named = {f"{name}-{i}": replace(copy, name=f"{name}-{i}")
             for i, copy in enumerate(copies, 1)}
    result: dict[str, LocalService] = {}
    for key, service in services.items():
        if key == name:
            result.update(named)
            continue
        needs = dict(service.depends_on)
        if name in needs:
            condition = needs.pop(name)
            needs.update(dict.fromkeys(named, condition))
            service = replace(service, depends_on=needs)
        result[key] = service
    return result


def client_settings(services: Mapping[str, LocalService]) -> dict[str, str]:
    """The ``TANGRAM_`` settings a client on this host uses to reach the local stack."""
    found: dict[str, str] = {}
    for service in services.values():
        for key in CLIENT_SETTINGS:
            if key in service.environment:
                found.setdefault(key, service.environment[key])
    return found


@contextlib.contextmanager
def local_stack(options: UpOptions, environ: Mapping[str, str] | None = None,
                announce: Callable[[str], None] = print,
                stop: threading.Event | None = None) -> Iterator[LocalStack]:
    """Start the services of ``options`` as local processes (state dir, ``client.env``,
    ``stack.json``) and yield the stack once every one has started (or ``stop`` is set);
    on leaving, stop them all, announce their final status and remove ``stack.json``.
    Raises :class:`ServiceError` when a service fails to start (after stopping the others)."""
    environ = dict(os.environ if environ is None else environ)
    state_dir = options.state_dir
    if running_supervisor(state_dir):
        raise ServiceError(f"a tangram up already runs on {state_dir}; `tangram down "
                           f"--state-dir {state_dir}` stops it")
    state_dir.mkdir(parents=True, exist_ok=True)
    _, services, skipped, base_env = plan(options, environ)
    for name in skipped:
        announce(f"{name}: skipped (not tangram's image: it runs only under docker compose)")
    (state_dir / "volumes").mkdir(exist_ok=True)
    write_private(state_dir / "client.env", client_settings(services))
    stack = LocalStack(services, list(services), state_dir, base_env, announce)
    try:
        stack.start(stop or threading.Event())
        yield stack
    finally:
        stack.stop()
        announce(render_status(stack.status_rows()))
        (state_dir / STATE_FILE).unlink(missing_ok=True)


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


def up(options: UpOptions, environ: Mapping[str, str] | None = None,
       announce: Callable[[str], None] = print) -> int:
    """Run ``tangram up`` in the foreground until Ctrl-C, SIGTERM or ``tangram down``."""
    started = time.monotonic()
    stop = threading.Event()
    previous = {signum: signal.signal(signum, lambda *_: stop.set())
                for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        with local_stack(options, environ, announce, stop) as stack:
            if not stop.is_set():
                announce(render_status(stack.status_rows()))
                announce(f"stack up in {time.monotonic() - started:.1f} s; clients: "
                         f"`set -a; . {stack.state_dir / 'client.env'}; set +a`; stop: "
                         f"Ctrl-C or `tangram down --state-dir {stack.state_dir}`")
                stack.watch(stop)
        return 0
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def down(state_dir: Path, timeout: float = DOWN_TIMEOUT_S,
         announce: Callable[[str], None] = print) -> int:
    """Stop the ``tangram up`` running on ``state_dir`` and wait until it has stopped its
    services; when its supervisor died, stop the services it recorded. 0 when nothing runs."""
    path = state_dir / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        announce(f"tangram down: no stack runs on {state_dir}")
        return 0
    supervisor = state.get("supervisor") or {}
    pid, start_time = supervisor.get("pid"), supervisor.get("start_time")
    if pid and alive(int(pid), start_time):
        os.kill(int(pid), signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while alive(int(pid), start_time) and time.monotonic() < deadline:
            time.sleep(0.2)
        if alive(int(pid), start_time):
            announce(f"tangram down: the supervisor (pid {pid}) did not stop within "
                     f"{timeout:.0f} s; stopping its services")
    for name, record in reversed(list((state.get("services") or {}).items())):
        service_pid, service_start = record.get("pid"), record.get("start_time")
        if service_pid and alive(int(service_pid), service_start):
            announce(f"tangram down: stopping {name} (pid {service_pid})")
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(service_pid), signal.SIGTERM)
            deadline = time.monotonic() + 30.0
            while alive(int(service_pid), service_start) and time.monotonic() < deadline:
                time.sleep(0.2)
        if service_pid:
            kill_group(int(service_pid))
    path.unlink(missing_ok=True)
    announce(f"tangram down: stopped the stack on {state_dir}")
    return 0


def add_up_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``tangram up``."""
    parser.add_argument("services", nargs="*", help="services to start (default: all without "
                        "a profile) with their dependencies")
    parser.add_argument("-f", "--file", type=Path, default=DEFAULT_COMPOSE_FILE,
                        help=f"compose file (default {DEFAULT_COMPOSE_FILE})")
    parser.add_argument("--env-file", type=Path, default=None,
                        help="env file (default: .env beside the compose file, if present)")
    parser.add_argument("--profile", action="append", default=[],
                        help="also start the services of this profile (repeatable)")
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR,
                        help=f"logs, volumes and process ids (default {DEFAULT_STATE_DIR})")
    parser.add_argument("--sandbox", choices=("bwrap", "docker"), default="bwrap",
                        help="the CPU node's sandbox backend (default bwrap, the embedded one)")


def add_down_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``tangram down``."""
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR,
                        help=f"the state dir of the tangram up to stop "
                             f"(default {DEFAULT_STATE_DIR})")
    parser.add_argument("--timeout", type=float, default=DOWN_TIMEOUT_S,
                        help="seconds to wait for it to stop its services")
    parser.add_argument("-v", "--volumes", action="store_true",
                        help="also delete the volume directories (Redis's AOF)")


def run_up(args: argparse.Namespace) -> int:
    """``tangram up`` from parsed :func:`add_up_arguments`."""
    options = UpOptions(compose_file=args.file, env_file=args.env_file,
                        state_dir=args.state_dir, services=tuple(args.services),
                        profiles=tuple(args.profile), sandbox=args.sandbox)
    return up(options, announce=lambda line: print(line, flush=True))


def run_down(args: argparse.Namespace) -> int:
    """``tangram down`` from parsed :func:`add_down_arguments`."""
    status = down(args.state_dir, args.timeout, announce=lambda line: print(line, flush=True))
    if args.volumes:
        import shutil

        shutil.rmtree(args.state_dir / "volumes", ignore_errors=True)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tangram_celery.stack.up up|down ...``."""
    parser = argparse.ArgumentParser(prog="tangram")
    commands = parser.add_subparsers(dest="command", required=True)
    add_up_arguments(commands.add_parser("up"))
    add_down_arguments(commands.add_parser("down"))
    args = parser.parse_args(argv)
    return run_up(args) if args.command == "up" else run_down(args)


if __name__ == "__main__":
    sys.exit(main())
