"""The real stack of a MOPD run: tritonserver's flags, its log and the watch on it; the GPU pool
workers, their environment, their decisions and their errors."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tangram_bench.mopd_real.actions import PoolLayout
from tangram_bench.mopd_real.config import GPU_MEMORY_MB, RealGpuConfig
from tangram_celery import keys
from tangram_celery.connection import connect
from tangram_celery.pools.gpu_pool import worker_name
from tangram_celery.pools.launch import spawn_gpu_worker, wait_for_worker
from tangram_celery.processes import stop_process
from tangram_celery.reward.server import TritonServer
from tangram_celery.settings import Settings
from tangram_celery.tasks.app import make_app

CRASH_POLL_S = 0.5
LOGLEVEL = "WARNING"
T = TypeVar("T")
LOADED = re.compile(r"successfully loaded '([^']+)'")
UNLOADED = re.compile(r"successfully unloaded '([^']+)'")


def server_args(config: RealGpuConfig) -> list[str]:
    """The run's extra ``tritonserver`` flags: as many model-load threads as GPUs. Triton loads
    at most ``--model-load-thread-count`` models at once (default 4) and queues the rest;
    evict-on-execution may restore a service on every GPU at the same moment (8 concurrent
    1-instance loads: 4.7 s with the default, 2.4 s with 16 threads, measured here)."""
    return [f"--model-load-thread-count={max(4, config.gpus)}"]


def worker_env(settings: Settings, triton: TritonServer, repository: Path, scheduler: str,
               restore_prior_s: float) -> dict[str, str]:
    """The ``TANGRAM_`` environment of the run's GPU pool workers. They talk to Triton over
    gRPC: a load over HTTP holds one of Triton's HTTP worker threads for the whole load and
    stalls the inference requests that thread serves (1.3-1.5 s per 8-instance load measured
    here; triton-inference-server/server#8958, fix pending in #8737), and evict-on-execution
    loads often."""
    return {
        "TANGRAM_REDIS_URL": settings.broker.redis_url,
        "TANGRAM_TRITON_URL": triton.grpc_url,
        "TANGRAM_TRITON_PROTOCOL": "grpc",
        "TANGRAM_TRITON_REPOSITORY": str(repository),
        "TANGRAM_SCHEDULER": scheduler,
        "TANGRAM_GPU_SIMULATED": "true",
        "TANGRAM_GPU_MEMORY_MB": str(GPU_MEMORY_MB),
        "TANGRAM_GPU_RESTORE_S": f"{restore_prior_s:.6f}",
    }


def worker_args(pool: PoolLayout, window: int) -> list[str]:
    """The command-line options of ``pool``'s worker: batching off, ``--cache-aware`` where the
    layout says, an admission window of at least ``window``."""
    return ["--node-size", str(pool.node_size), "--no-batching",
            "--gpu-ids", ",".join(str(g) for g in pool.gpu_ids),
            "--concurrency", str(max(window, 2 * len(pool.gpu_ids))),
            "--loglevel", LOGLEVEL, *(["--cache-aware"] if pool.cache_aware else [])]


@contextlib.contextmanager
def pool_workers(settings: Settings, env: Mapping[str, str], pools: Sequence[PoolLayout],
                 window: int, logs: Path) -> Iterator[list[str]]:
    """Start one GPU pool worker per layout (:func:`worker_args`); yields their Celery names;
    stops them (SIGTERM: each unloads its idle services) when done."""
    app = make_app(settings)
    started = []
    try:
        names = []
        for pool in pools:
            args = worker_args(pool, window)
            env_of = {**env, "TANGRAM_SCHEDULER": pool.scheduler}
            process = spawn_gpu_worker(env_of, pool.name, len(pool.gpu_ids),
                                       logs / f"{pool.name}.log", args)
            started.append(process)
            names.append(worker_name(pool.name, process.pid))
        for name, process in zip(names, started, strict=True):
            wait_for_worker(app, name, process, timeout=120)
        yield names
    finally:
        for process in started:
            stop_process(process, timeout=30)
        app.close()


def pool_decisions(settings: Settings, pools: Sequence[PoolLayout],
                   wait: bool = True) -> tuple[int, float]:
    """The scheduler calls and wall seconds the ``pools`` published, summed; after one more
    heartbeat with ``wait`` (so that their last decisions are counted)."""
    if wait:
        time.sleep(settings.node.heartbeat_s + 0.5)
    client = connect(settings.broker)
    try:
        calls, seconds = 0, 0.0
        for pool in pools:
            raw = client.hmget(keys.gpu_pool(pool.name), ["decide_calls", "decide_s"])
            calls += int(raw[0] or 0)
            seconds += float(raw[1] or 0.0)
        return calls, seconds
    finally:
        client.close()


def log_events(server: TritonServer) -> tuple[list[str], list[str]]:
    """The names Triton reports it loaded and unloaded so far (its log)."""
    try:
        text = server.log_path.read_text(errors="replace")
    except OSError:
        return [], []
    return LOADED.findall(text), UNLOADED.findall(text)


class TritonCrashed(RuntimeError):
    """The run's tritonserver exited while the run needed it."""


class Watch:
    """Runs a coroutine while watching a run's ``tritonserver``: when the server dies, its
    process group (the python-backend stubs, which hold the workers' connections open) is
    killed and :class:`TritonCrashed` raised, instead of the calls waiting for Triton's
    network timeout."""

    def __init__(self) -> None:
        self.triton: TritonServer | None = None
        self.pid: int | None = None

    def attach(self, triton: TritonServer) -> TritonServer:
        """Watch ``triton`` (started) from now on."""
        self.triton, self.pid = triton, triton.pid
        return triton

    async def guard(self, work: Coroutine[Any, Any, T]) -> T:
        """The result of ``work``, unless the server dies first."""
        task = asyncio.ensure_future(work)
        while not task.done():
            await asyncio.wait({task}, timeout=CRASH_POLL_S)
            if not task.done() and self.triton is not None and not self.triton.running():
                task.cancel()
                self.kill()
                raise TritonCrashed(f"tritonserver exited during the run:\n"
                                    f"{self.triton.log_tail(1500)}")
        return task.result()

    def kill(self) -> None:
        """Kill whatever is left of the server's process group."""
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)


def worker_errors(logs: Path, chars: int = 3000) -> str:
    """The tail of each worker log that holds a traceback (for an error message)."""
    tails = []
    for log in sorted(logs.glob("*.log")):
        text = log.read_text(errors="replace")
        if "Traceback" in text:
            tails.append(f"--- {log.name} ---\n{text[-chars:]}")
    return "\n".join(tails)
