"""Placement policies for the admission gate, built on the pure schedulers.

:func:`snapshot_policy` adapts any scheduler (a callable from
:class:`~tangram_celery.scheduling.Snapshot` to :class:`~tangram_celery.scheduling.Decision`) to the
:class:`~tangram_celery.pools.admission.Admission` gate of one pool: it turns waiting requests and
running actions into scheduler jobs, asks for a decision, and returns the grants. The same adapter
serves CPU nodes (cores with NUMA groups) and GPU pools (aligned power-of-two chunks).
:func:`robust_policy` runs tangram's default, load-robust scheduler
(:mod:`tangram_celery.scheduling.robust`) on CPU nodes, :func:`replica_policy` its
service-aware scheduler on GPU pools (:mod:`tangram_celery.scheduling.replicas`), and
:func:`elastic_policy` the paper's allocator alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from tangram_celery.pools.admission import Grant, Policy, PoolState, Request
from tangram_celery.scheduling import (
    Core,
    CpuPool,
    Decision,
    GpuPool,
    Job,
    Pool,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    decide,
)
from tangram_celery.scheduling.replicas import ReplicaConfig, ReplicaPolicy
from tangram_celery.scheduling.residency import Resident
from tangram_celery.scheduling.robust import RobustConfig, RobustPolicy
from tangram_celery.scheduling.types import Service

PoolFactory = Callable[[tuple[int, ...], int], Pool]
Scheduler = Callable[[Snapshot], Decision]
"""A scheduling decision over one snapshot (may keep state across calls, such as forecasts)."""


def cpu_pool_factory(name: str, numa_of: Mapping[int, int] | None = None) -> PoolFactory:
    """Build CPU pool views whose cores carry their NUMA group (unit id -> group).

    ``name`` is the pool's key: jobs built with the same key are placed on it.
    """
    groups = dict(numa_of or {})

    def make(free: tuple[int, ...], total: int) -> Pool:
        return CpuPool(name, tuple(Core(u, groups.get(u, 0)) for u in free), total)

    return make


@dataclass(frozen=True)
class Residency:
    """What a GPU pool holds now, for the service-aware scheduler: the resident services (on
    unit ids), each service's memory and restore time per chunk size, each GPU's memory."""

    residents: tuple[Resident, ...] = ()
    services: tuple[Service, ...] = ()
    memory_mb: int = 0


def gpu_pool_factory(name: str, node_size: int = 8,
                     residency: Callable[[], Residency] | None = None) -> PoolFactory:
    """Build GPU pool views (ids 0..total-1, ``node_size`` GPUs per node) keyed ``name``;
    with ``residency``, each view carries what it returns at that moment."""

    def make(free: tuple[int, ...], total: int) -> Pool:
        held = Residency() if residency is None else residency()
        return GpuPool(name, free, total, min(node_size, total), held.residents,
                       held.services, held.memory_mb)

    return make


def job_for(request: Request, key: str) -> Job:
    """The scheduler's view of a waiting request."""
    known = all(d is not None for _, d in request.options)
    return Job(request.id, key, request.options, request.arrived,
               elastic=known and len(request.options) > 1, service=request.service)


def elastic_policy(
    key: str, pool_factory: PoolFactory, config: SchedulerConfig | None = None
) -> Policy:
    """A placement policy running the paper's ARL-Tangram decision for one pool at each event."""
    return snapshot_policy(key, pool_factory, partial(decide, config=config or SchedulerConfig()))


def robust_policy(
    key: str, pool_factory: PoolFactory, config: RobustConfig | None = None
) -> Policy:
    """A placement policy running tangram's load-robust scheduler for one pool (the default)."""
    return snapshot_policy(key, pool_factory, RobustPolicy(config))


def replica_policy(
    key: str, pool_factory: PoolFactory, config: ReplicaConfig | None = None
) -> Policy:
    """A placement policy running the service-aware GPU scheduler
    (:mod:`tangram_celery.scheduling.replicas`: cache affinity, replica scaling, backfilling)
    for one GPU pool; ``pool_factory`` should carry the pool's residency."""
    return snapshot_policy(key, pool_factory, ReplicaPolicy(config))


def snapshot_policy(key: str, pool_factory: PoolFactory, scheduler: Scheduler) -> Policy:
    """A placement policy asking `scheduler` for a decision over one pool at each event."""
    jobs: dict[str, Job] = {}

    def policy(state: PoolState) -> Sequence[Grant]:
        current = {r.id for r in state.waiting}
        for stale in set(jobs) - current:
            del jobs[stale]
        waiting = tuple(jobs.setdefault(r.id, job_for(r, key)) for r in state.waiting)
        running = tuple(
            RunningJob(r.id, key, len(r.units), r.expected_end, r.units, r.service)
            for r in state.running
        )
        snapshot = Snapshot(state.now, waiting, (pool_factory(state.free, state.total),),
                            running)
        decision = scheduler(snapshot)
        return [(start.job_id, start.units) for start in decision.starts]

    return policy
