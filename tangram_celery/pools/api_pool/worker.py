"""The API pool worker: its window and name, its command line, starting it as a process."""

from __future__ import annotations

import argparse
import logging
import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from celery import Celery

from tangram_celery import keys
from tangram_celery.command_line import run_with_settings
from tangram_celery.connection import connect
from tangram_celery.errors import ServiceError
from tangram_celery.managers.basic import ApiGate, ApiSpec, QuotaStore, parse_api_limits
from tangram_celery.pools.api_pool.runtime import ApiPool
from tangram_celery.pools.serving import serve
from tangram_celery.settings import Settings


def default_window(spec: ApiSpec) -> int:
    """Messages an API worker holds at once: twice the API's concurrency (at least +4), or 16
    for an API limited by quota only; never more than about a minute of its quota, so a held
    (unacked) message never waits anywhere near the broker's visibility timeout. Waiters beyond
    what the API allows queue in the gate, in the basic manager's order; the rest stay in the
    broker's queue (FIFO)."""
    window = 16 if spec.concurrency is None else max(2 * spec.concurrency, spec.concurrency + 4)
    if spec.quota is not None:
        window = min(window, spec.quota.capacity + math.ceil(spec.quota.rate_per_s * 60))
    return max(window, 1)


def worker_name(api: str, pid: int | None = None, host: str | None = None) -> str:
    """Celery node name of the API worker running in process ``pid``."""
    return f"api-{api}-{pid or os.getpid()}@{host or socket.gethostname()}"


def build_api_pool(settings: Settings, api: str) -> ApiPool:
    """An API pool runtime for ``api`` over the settings' Redis."""
    specs = parse_api_limits(settings.api.limits)
    client = connect(settings.broker)
    store = QuotaStore(client, specs, settings.api.bypass_s)
    return ApiPool(settings, api, ApiGate(store), worker_name(api))


def run_api_worker(settings: Settings, api: str, concurrency: int | None = None,
                   loglevel: str = "INFO") -> None:
    """Run an API pool worker for ``api`` in this process until it is told to stop."""
    pool = build_api_pool(settings, api)
    window = concurrency or settings.node.admission_window or default_window(pool.spec)
    serve(settings, pool, keys.api_queue(api), f"api-{api}-{os.getpid()}@%h", window, loglevel,
          f"API pool {api} ready: window {window}, limits {pool.spec}")


def spawn_api_worker(env: Mapping[str, str], api: str, concurrency: int | None = None,
                     log_path: Path | None = None) -> subprocess.Popen[bytes]:
    """Start an API worker subprocess with the given ``TANGRAM_`` environment."""
    argv = [sys.executable, "-m", "tangram_celery.pools.api_pool", "--api", api]
    if concurrency:
        argv += ["--concurrency", str(concurrency)]
    output = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    try:
        return subprocess.Popen(argv, env={**os.environ, **env}, stdout=output,
                                stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        if log_path:
            output.close()  # type: ignore[union-attr]


def wait_for_worker(app: Celery, name: str, process: subprocess.Popen[bytes] | None = None,
                    timeout: float = 30.0) -> None:
    """Block until the Celery worker ``name`` answers a ping (it then consumes its queue)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise ServiceError(f"worker {name} exited with {process.returncode}; see its log")
        if app.control.ping(destination=[name], timeout=0.3, limit=1):
            return
    raise ServiceError(f"worker {name} did not answer within {timeout} s; see its log")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tangram_celery.pools.api_pool --api NAME [--concurrency N] [--loglevel L]``."""
    parser = argparse.ArgumentParser(prog="python -m tangram_celery.pools.api_pool",
                                     description="run an API pool worker")
    parser.add_argument("--api", required=True, help="API name; its queue is tangram.api.NAME")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="messages held at once (default: 2x the API's concurrency, min +4)")
    parser.add_argument("--loglevel", default="INFO")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    return run_with_settings(parser, lambda settings, args: run_api_worker(
        settings, args.api, args.concurrency, args.loglevel), argv)
