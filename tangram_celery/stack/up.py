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

``tangram up --ha`` runs Redis under Sentinel: the compose file's ``ha`` profile (a replica and
three Sentinels beside the primary) with every service's ``TANGRAM_REDIS_URL`` naming the
Sentinels (:data:`~tangram_celery.stack.plan.HA_VARIABLES`), and ``client.env`` the same.

Local differences from the containers, all explicit: the sandbox backend is ``--sandbox``
(default ``bwrap``, the embedded one) through ``STACK_SANDBOX_BACKEND``; missing passwords are
generated; a service whose image is not tangram's (Prometheus) is skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from tangram_celery.errors import ServiceError
from tangram_celery.stack.compose import DEFAULT_COMPOSE_FILE
from tangram_celery.stack.plan import (
    DEFAULT_STATE_DIR,
    UpOptions,
    client_settings,
    plan,
    write_private,
)
from tangram_celery.stack.supervisor import (
    STATE_FILE,
    LocalStack,
    alive,
    kill_group,
    render_status,
    running_supervisor,
)

DOWN_TIMEOUT_S = 180.0


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
    parser.add_argument("--ha", action="store_true",
                        help="Redis under Sentinel: a primary, a replica and three Sentinels "
                             "(the compose file's ha profile), every service on the Sentinels")


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
                        profiles=tuple(args.profile), sandbox=args.sandbox, ha=args.ha)
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
