"""Starting tangram workers: build the runtime, attach it to the app, run Celery's worker."""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

from tangram_celery import keys
from tangram_celery.pools.admission import Policy, fcfs_minimum
from tangram_celery.pools.durations import SharedDurations
from tangram_celery.pools.node import CpuNode
from tangram_celery.pools.placement import cpu_pool_factory, elastic_policy, robust_policy
from tangram_celery.pools.registry import Registry
from tangram_celery.pools.serving import admission_window, serve
from tangram_celery.sandbox import SandboxLimits, make_backend
from tangram_celery.scheduling import DurationModel, SchedulerConfig
from tangram_celery.scheduling.robust import RobustConfig
from tangram_celery.settings import Settings

log = logging.getLogger(__name__)

UIDS_PER_NODE = 65536
NODE_UID_SLOTS = 1024


def sandbox_limits(settings: Settings) -> SandboxLimits:
    """The sandbox limits that follow from the settings."""
    return SandboxLimits(
        memory_mb=settings.sandbox_memory_mb,
        pids=settings.sandbox_pids,
        file_size_mb=settings.sandbox_file_size_mb,
        workdir_mb=settings.sandbox_workdir_mb,
        tmp_mb=settings.sandbox_tmp_mb,
        output_cap_bytes=settings.output_cap_bytes,
    )


def unit_cpus(units: int, cpus: Sequence[int] | None = None) -> list[int]:
    """Host CPUs backing logical unit ids ``0..units-1``: unit ``u`` runs on CPU
    ``available[u % len(available)]`` (several units share a CPU when oversubscribed)."""
    available = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    return [available[u % len(available)] for u in range(units)]


def node_uid_base(base: int, name: str) -> int:
    """The first sandbox uid of a node: nodes sharing a host get disjoint uid ranges."""
    return base + (zlib.crc32(name.encode()) % NODE_UID_SLOTS) * UIDS_PER_NODE


def backend_options(settings: Settings, node: str) -> dict[str, Any]:
    """The keyword options of the configured sandbox backend."""
    if settings.sandbox_backend == "docker":
        from tangram_celery.sandbox.docker import WarmPoolPolicy

        return {
            "docker_url": settings.sandbox_docker_url,
            "image": settings.sandbox_docker_image,
            "idle_ttl_s": settings.sandbox_idle_ttl_s,
            "warm_pool": WarmPoolPolicy(settings.sandbox_warm_pool_min,
                                        settings.sandbox_warm_pool_max),
        }
    return {"uid_base": node_uid_base(settings.sandbox_uid_base, node),
            "uid_count": UIDS_PER_NODE, "ready": settings.sandbox_ready}


def build_cpu_node(settings: Settings, name: str, cores: int, memory_mb: float) -> CpuNode:
    """A CPU node runtime with its sandbox backend and Redis registry."""
    sandbox = make_backend(
        settings.sandbox_backend,
        settings.sandbox_root / name,
        sandbox_limits(settings),
        **backend_options(settings, name),
    )
    client = redis.Redis.from_url(settings.redis_url)
    registry = Registry(client, settings.node_ttl_s, settings.trajectory_ttl_s)
    cpus = unit_cpus(cores)
    shared = None
    if settings.durations_sync_s > 0:
        shared = SharedDurations(client, name, DurationModel(), settings.durations_sync_s)
        shared.catch_up()
    return CpuNode(settings, name, cores, cpus, memory_mb, sandbox, registry,
                   policy=cpu_policy(settings, cpus), shared=shared)


def cpu_policy(settings: Settings, cpus: Sequence[int]) -> Policy:
    """The node's placement policy (``settings.scheduler``): the load-robust scheduler (the
    default), the paper's elastic scheduler alone, or strict FCFS at the minimum."""
    if settings.scheduler == "fcfs-min":
        return fcfs_minimum
    numa = host_numa_groups()
    groups = {unit: numa.get(cpu, 0) for unit, cpu in enumerate(cpus)}
    pools = cpu_pool_factory("cpu", groups)
    base = SchedulerConfig(depth=settings.scheduler_depth)
    if settings.scheduler == "elastic":
        return elastic_policy("cpu", pools, base)
    return robust_policy("cpu", pools, RobustConfig(base=base))


def host_numa_groups(root: Path = Path("/sys/devices/system/node")) -> dict[int, int]:
    """Host CPU id -> NUMA node, from sysfs (empty when the host does not say)."""
    groups: dict[int, int] = {}
    for node_dir in sorted(root.glob("node[0-9]*")):
        try:
            text = (node_dir / "cpulist").read_text().strip()
        except OSError:
            continue
        for cpu in parse_cpulist(text):
            groups[cpu] = int(node_dir.name[4:])
    return groups


def parse_cpulist(text: str) -> list[int]:
    """Parse a kernel CPU list such as ``0-3,8,10-11``."""
    cpus: list[int] = []
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return cpus


def run_cpu_worker(
    settings: Settings, name: str, cores: int, memory_mb: float,
    concurrency: int | None = None, loglevel: str = "INFO",
) -> None:
    """Run a CPU node worker in this process until it is told to stop."""
    node = build_cpu_node(settings, name, cores, memory_mb)
    window = admission_window(settings, cores, concurrency)
    serve(settings, node, keys.cpu_queue(name), f"cpu-{name}@%h", window, loglevel,
          f"CPU node {name} ready: {cores} cores, window {window}")
