"""The GPU pool worker: building its runtime, its command line, running it in this process."""

from __future__ import annotations

import argparse
import logging
import os
import socket
from collections.abc import Sequence
from pathlib import Path

from tangram_celery import keys
from tangram_celery.command_line import run_with_settings
from tangram_celery.connection import connect
from tangram_celery.errors import ConfigError
from tangram_celery.keys import DEFAULT_GPU_POOL
from tangram_celery.pools.duration_sharing import SharedDurations
from tangram_celery.pools.gpu_pool.backend import DEFAULT_TRITON_RETRY_S
from tangram_celery.pools.gpu_pool.batching import DEFAULT_MAX_BATCH
from tangram_celery.pools.gpu_pool.inventory import check_pool_name
from tangram_celery.pools.gpu_pool.policy import DEFAULT_NODE_SIZE
from tangram_celery.pools.gpu_pool.runtime import GpuPoolRuntime
from tangram_celery.pools.serving import admission_window, serve
from tangram_celery.scheduling import DurationModel
from tangram_celery.settings import Settings, TritonSettings


def model_repository(triton: TritonSettings) -> Path:
    """``TANGRAM_TRITON_REPOSITORY``; a relative path that does not exist from here is taken
    relative to the source checkout (where ``triton_models/`` lives)."""
    path = triton.repository
    if path.is_absolute() or path.exists():
        return path
    from tangram_celery.reward.executor import default_repository

    return default_repository().parent / path


def worker_name(pool: str, pid: int | None = None, host: str | None = None) -> str:
    """Celery node name of the GPU pool worker running in process ``pid``."""
    return f"gpu-{pool}-{pid or os.getpid()}@{host or socket.gethostname()}"


def build_gpu_pool(
    settings: Settings,
    pool: str,
    gpus: int,
    node_size: int = DEFAULT_NODE_SIZE,
    gpu_ids: Sequence[int] | None = None,
    triton_retry_s: float = DEFAULT_TRITON_RETRY_S,
    batching: bool = True,
    max_batch: int = DEFAULT_MAX_BATCH,
    cache_aware: bool = False,
) -> GpuPoolRuntime:
    """A GPU pool runtime over the settings' Triton server and model repository; it shares
    the service times it learns with the other GPU pools unless ``TANGRAM_DURATIONS_SYNC_S``
    is 0."""
    from tangram_celery.reward.executor import RewardExecutor

    ids = tuple(range(gpus)) if gpu_ids is None else tuple(gpu_ids)
    if len(ids) != gpus:
        raise ConfigError(f"--gpus {gpus} but {len(ids)} GPU ids were given: {list(ids)}")
    executor = RewardExecutor(
        settings.triton.url,
        model_repository(settings.triton),
        gpu_ids=ids,
        gpu_memory_mb=settings.gpu.memory_mb,
        simulate_gpus=settings.gpu.simulated,
        protocol="grpc" if settings.triton.protocol == "grpc" else "http",
        timeout_s=settings.actions.max_timeout_s,
        namespace=check_pool_name(pool),
        key=settings.triton.key,
    )
    client = connect(settings.broker)
    name = worker_name(pool)
    shared = None
    if settings.node.durations_sync_s > 0:
        shared = SharedDurations(client, name, DurationModel(), settings.node.durations_sync_s,
                                 pools=keys.GPU)
        shared.catch_up()
    return GpuPoolRuntime(settings, pool, executor, ids, node_size, name=name, client=client,
                          triton_retry_s=triton_retry_s, batching=batching,
                          max_batch=max_batch, shared=shared, cache_aware=cache_aware)


def run_gpu_worker(
    settings: Settings,
    pool: str,
    gpus: int,
    node_size: int = DEFAULT_NODE_SIZE,
    concurrency: int | None = None,
    loglevel: str = "INFO",
    gpu_ids: Sequence[int] | None = None,
    triton_retry_s: float = DEFAULT_TRITON_RETRY_S,
    batching: bool = True,
    max_batch: int = DEFAULT_MAX_BATCH,
    cache_aware: bool = False,
) -> None:
    """Run a GPU pool worker on ``tangram.gpu.<pool>`` in this process until told to stop."""
    runtime = build_gpu_pool(settings, pool, gpus, node_size, gpu_ids, triton_retry_s,
                             batching, max_batch, cache_aware)
    window = admission_window(settings.node, gpus, concurrency)
    kind = "simulated" if settings.gpu.simulated else "real"
    serve(settings, runtime, keys.gpu_queue(pool), worker_name(pool), window, loglevel,
          f"GPU pool {pool} ready: {gpus} {kind} GPUs (nodes of {runtime.node_size}), "
          f"window {window}, Triton {settings.triton.url} ({settings.triton.protocol}), "
          f"batching {f'up to {max_batch} joiners' if batching else 'off'}")


def parse_gpu_ids(raw: str) -> list[int]:
    """``"4,5,6,7"`` -> ``[4, 5, 6, 7]`` (for ``--gpu-ids``)."""
    try:
        return [int(part) for part in raw.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r}: expected GPU ids such as 4,5,6,7") from None


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a GPU pool worker (``args.gpu_pool``: ``--pool`` must not clash with the
    CLI's own ``pool`` subcommand field)."""
    parser.add_argument("--pool", dest="gpu_pool", default=DEFAULT_GPU_POOL,
                        help="pool name; its queue is tangram.gpu.NAME (default: default)")
    parser.add_argument("--gpus", type=int, required=True,
                        help="GPUs this pool schedules (simulated unless "
                             "TANGRAM_GPU_SIMULATED=false)")
    parser.add_argument("--node-size", type=int, default=DEFAULT_NODE_SIZE,
                        help="GPUs per node; chunks never cross a node (default 8)")
    parser.add_argument("--gpu-ids", type=parse_gpu_ids, default=None,
                        help="the pool's GPU ids, comma separated (default 0..N-1)")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="admission window: messages held at once (default max(2N, N+4))")
    parser.add_argument("--triton-retry-s", type=float, default=None,
                        help="how long an action waits for an unavailable (or restarted) Triton "
                             f"before it fails (default {DEFAULT_TRITON_RETRY_S:g})")
    parser.add_argument("--no-batching", dest="batching", action="store_false",
                        help="give every reward action its own chunk (no joining a running "
                             "batch of its service)")
    parser.add_argument("--max-batch", type=int, default=None,
                        help="actions that may join a running batch of a service on its chunk "
                             f"(default TANGRAM_REWARD_MAX_BATCH, {DEFAULT_MAX_BATCH})")
    parser.add_argument("--cache-aware", action="store_true",
                        help="run the pooled baselines' cache-aware FCFS (resident first, a "
                             "bounded wait for a busy replica, grants on resident chunks) "
                             "instead of TANGRAM_SCHEDULER's decision")
    parser.add_argument("--loglevel", default="INFO")


def run_from_args(settings: Settings, args: argparse.Namespace) -> None:
    """Run the worker that :func:`add_worker_arguments` options describe."""
    retry = settings.triton.retry_s if args.triton_retry_s is None else args.triton_retry_s
    run_gpu_worker(settings, args.gpu_pool, args.gpus, args.node_size, args.concurrency,
                   args.loglevel, args.gpu_ids, retry, args.batching,
                   settings.gpu.reward_max_batch if args.max_batch is None else args.max_batch,
                   args.cache_aware)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tangram_celery.pools.gpu_pool --gpus N [--pool NAME] [--node-size K] ...``."""
    parser = argparse.ArgumentParser(prog="python -m tangram_celery.pools.gpu_pool",
                                     description="run a GPU reward pool worker")
    add_worker_arguments(parser)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    return run_with_settings(parser, run_from_args, argv)
