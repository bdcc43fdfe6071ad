"""Starting a CPU node worker: build the node, attach it to the app, run Celery's worker."""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tangram_celery import keys
from tangram_celery.connection import connect
from tangram_celery.pools.admission import Policy, fcfs_minimum
from tangram_celery.pools.cpu_pool.node import CpuNode
from tangram_celery.pools.duration_sharing import SharedDurations
from tangram_celery.pools.placement import cpu_pool_factory, elastic_policy, robust_policy
from tangram_celery.pools.registry import Registry
from tangram_celery.pools.serving import admission_window, serve
from tangram_celery.sandbox import SandboxLimits, make_backend
from tangram_celery.scheduling import DurationModel, SchedulerConfig
from tangram_celery.scheduling.robust import RobustConfig
from tangram_celery.settings import NodeSettings, SandboxSettings, Settings
from tangram_celery.tasks.ledger import Ledger

log = logging.getLogger(__name__)

UIDS_PER_NODE = 65536
NODE_UID_SLOTS = 1024


def sandbox_limits(sandbox: SandboxSettings, node_memory_mb: float = 0.0) -> SandboxLimits:
    """The sandbox limits that follow from the settings; one action may ask for up to the
    node's memory (``node_memory_mb``) when that is more than the default."""
    return SandboxLimits(
        max_memory_mb=max(int(node_memory_mb), sandbox.memory_mb),
        memory_mb=sandbox.memory_mb,
        pids=sandbox.pids,
        file_size_mb=sandbox.file_size_mb,
        workdir_mb=sandbox.workdir_mb,
        tmp_mb=sandbox.tmp_mb,
        output_cap_bytes=sandbox.output_cap_bytes,
    )


def unit_cpus(units: int, cpus: Sequence[int] | None = None) -> list[int]:
    """Host CPUs backing logical unit ids ``0..units-1``: unit ``u`` runs on CPU
    ``available[u % len(available)]`` (several units share a CPU when oversubscribed)."""
    available = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    return [available[u % len(available)] for u in range(units)]


def node_uid_base(base: int, name: str) -> int:
    """The first sandbox uid of a node: nodes sharing a host get disjoint uid ranges."""
    return base + (zlib.crc32(name.encode()) % NODE_UID_SLOTS) * UIDS_PER_NODE


def backend_options(sandbox: SandboxSettings, node: str) -> dict[str, Any]:
    """The keyword options of the configured sandbox backend (both take the node's uid range)."""
    uids = {"uid_base": node_uid_base(sandbox.uid_base, node), "uid_count": UIDS_PER_NODE}
    if sandbox.backend == "docker":
        from tangram_celery.sandbox.docker import WarmPoolPolicy

        return {
            "docker_url": sandbox.docker_url,
            "image": sandbox.docker_image,
            "idle_ttl_s": sandbox.idle_ttl_s,
            "warm_pool": WarmPoolPolicy(sandbox.warm_pool_min,
                                        sandbox.warm_pool_max),
            **uids,
        }
    return {**uids, "ready": sandbox.ready, "recycle": sandbox.recycle,
            "enforce": sandbox.enforce}


def build_cpu_node(settings: Settings, name: str, cores: int, memory_mb: float) -> CpuNode:
    """A CPU node runtime with its sandbox backend and Redis registry."""
    sandbox = make_backend(
        settings.sandbox.backend,
        settings.sandbox.root / name,
        sandbox_limits(settings.sandbox, memory_mb),
        **backend_options(settings.sandbox, name),
    )
    client = connect(settings.broker)
    registry = Registry(client, settings.node.ttl_s, settings.actions.trajectory_ttl_s)
    cpus = unit_cpus(cores)
    shared = None
    if settings.node.durations_sync_s > 0:
        shared = SharedDurations(client, name, DurationModel(), settings.node.durations_sync_s)
        shared.catch_up()
    return CpuNode(settings, name, cores, cpus, memory_mb, sandbox, registry,
                   policy=cpu_policy(settings.node, cpus), shared=shared,
                   answered=Ledger(client, settings.broker.result_ttl_s).stored)


def cpu_policy(node: NodeSettings, cpus: Sequence[int]) -> Policy:
    """The node's placement policy (``node.scheduler``): the load-robust scheduler (the
    default), the paper's elastic scheduler alone, or strict FCFS at the minimum."""
    if node.scheduler == "fcfs-min":
        return fcfs_minimum
    numa = host_numa_groups()
    groups = {unit: numa.get(cpu, 0) for unit, cpu in enumerate(cpus)}
    pools = cpu_pool_factory("cpu", groups)
    base = SchedulerConfig(depth=node.scheduler_depth)
    if node.scheduler == "elastic":
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
    window = admission_window(settings.node, cores, concurrency)
    serve(settings, node, keys.cpu_queue(name), f"cpu-{name}@%h", window, loglevel,
          f"CPU node {name} ready: {cores} cores, window {window}")
