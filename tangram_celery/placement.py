"""Placement policies for the admission gate, built on the pure elastic scheduler.

:func:`elastic_policy` adapts :func:`tangram_celery.scheduling.decide` to the
:class:`~tangram_celery.admission.Admission` gate of one pool: it turns waiting requests and
running actions into scheduler jobs, asks for a decision, and returns the grants. The same
adapter serves CPU nodes (cores with NUMA groups) and GPU pools (aligned power-of-two chunks).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from tangram_celery.admission import Grant, Policy, PoolState, Request
from tangram_celery.scheduling import (
    Core,
    CpuPool,
    GpuPool,
    Job,
    Pool,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    decide,
)

PoolFactory = Callable[[tuple[int, ...], int], Pool]


def cpu_pool_factory(name: str, numa_of: Mapping[int, int] | None = None) -> PoolFactory:
    """Build CPU pool views whose cores carry their NUMA group (unit id -> group).

    ``name`` is the pool's key: jobs built with the same key are placed on it.
    """
    groups = dict(numa_of or {})

    def make(free: tuple[int, ...], total: int) -> Pool:
        return CpuPool(name, tuple(Core(u, groups.get(u, 0)) for u in free), total)

    return make


def gpu_pool_factory(name: str, node_size: int = 8) -> PoolFactory:
    """Build GPU pool views (ids 0..total-1, ``node_size`` GPUs per node) keyed ``name``."""

    def make(free: tuple[int, ...], total: int) -> Pool:
        return GpuPool(name, free, total, min(node_size, total))

    return make


def job_for(request: Request, key: str) -> Job:
    """The scheduler's view of a waiting request."""
    known = all(d is not None for _, d in request.options)
    return Job(request.id, key, request.options, request.arrived,
               elastic=known and len(request.options) > 1)


def elastic_policy(
    key: str, pool_factory: PoolFactory, config: SchedulerConfig | None = None
) -> Policy:
    """A placement policy running the ARL-Tangram decision for one pool at each event."""
    config = config or SchedulerConfig()
    jobs: dict[str, Job] = {}

    def policy(state: PoolState) -> Sequence[Grant]:
        current = {r.id for r in state.waiting}
        for stale in set(jobs) - current:
            del jobs[stale]
        waiting = tuple(jobs.setdefault(r.id, job_for(r, key)) for r in state.waiting)
        running = tuple(
            RunningJob(r.id, key, len(r.units), r.expected_end) for r in state.running
        )
        snapshot = Snapshot(state.now, waiting, (pool_factory(state.free, state.total),),
                            running)
        decision = decide(snapshot, config)
        return [(start.job_id, start.units) for start in decision.starts]

    return policy
