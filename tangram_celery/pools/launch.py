"""Pool workers as local processes: start CPU node and GPU pool workers, wait until they serve.

Used by the autoscaler's local actuator, ``tangram demo``, the tests and the benchmarks.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from celery import Celery

from tangram_celery.errors import ServiceError
from tangram_celery.pools.registry import Registry
from tangram_celery.processes import spawn_process


def spawn_cpu_worker(
    env: Mapping[str, str], node: str, cores: int, log_path: Path | None = None,
    extra_args: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """Start ``tangram worker cpu`` as a subprocess with the given ``TANGRAM_`` environment."""
    argv = [sys.executable, "-m", "tangram_celery.cli", "worker", "cpu", "--node", node,
            "--cores", str(cores), *extra_args]
    return spawn_process(argv, env, log_path)


def spawn_gpu_worker(
    env: Mapping[str, str], pool: str, gpus: int, log_path: Path | None = None,
    extra_args: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """Start a GPU pool worker (``python -m tangram_celery.pools.gpu_pool``) as a subprocess with
    the given ``TANGRAM_`` environment; its Celery node name is
    :func:`tangram_celery.pools.gpu_pool.worker_name` of the process id."""
    argv = [sys.executable, "-m", "tangram_celery.pools.gpu_pool", "--pool", pool,
            "--gpus", str(gpus), *extra_args]
    return spawn_process(argv, env, log_path)


def wait_for_worker(
    app: Celery, name: str, process: subprocess.Popen[bytes] | None = None,
    timeout: float = 60.0,
) -> None:
    """Block until the Celery worker ``name`` answers a ping (it then consumes its queue).

    Raises :class:`ServiceError` when ``process`` exits first or after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise ServiceError(f"worker {name} exited with {process.returncode}; see its log")
        if app.control.ping(destination=[name], timeout=0.5, limit=1):
            return
    raise ServiceError(f"worker {name} did not answer within {timeout} s; see its log")


def wait_for_nodes(registry: Registry, names: Sequence[str], timeout: float = 30.0) -> None:
    """Block until every named CPU node is registered, alive and consuming its queue."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = {n.name for n in registry.nodes() if n.alive}
        if set(names) <= alive:
            return
        time.sleep(0.05)
    raise ServiceError(f"CPU nodes {sorted(names)} did not come up within {timeout} s; "
                       "see the worker logs")
