"""The pooled GPU cluster (tangram, fixed DoP, plain Celery) with evict-on-execution.

All GPUs form one pool of aligned power-of-two chunks (nodes of ``gpus_per_node``), scheduled
by the system's policy, which also picks the chunk. The GPU manager's own pure policy then
decides the rest: if the service at that parallelism is not resident on the chunk, the
least-recently-used overlapping residents are unloaded
(:func:`~tangram_celery.scheduling.residency.plan_placement`, memory per GPU from
:meth:`GpuService.memory_mb`, residents on GPUs other actions hold are never unloaded, as in
the real manager) and the service is restored, which takes :meth:`Cluster.load_s` while
holding the chunk: that time is the action's overhead. Every (service, parallelism, chunk) is
its own resident, as in the real manager, so a service run at a new parallelism or on a new
chunk is restored again.

The policy sees the residents, each service's memory and restore time per chunk size, and the
GPU ids and service of every running action, so a service-aware policy
(:mod:`tangram_celery.scheduling.replicas`, tangram's default on GPUs) can plan with them; the
paper's allocator ignores them. A cache-aware pooled baseline (``cache_aware``) keeps its
policy's decisions (who starts, on how many GPUs) and moves each start onto a free chunk where
its service is resident, when one is
(:func:`~tangram_celery.scheduling.affinity.cache_aware_chunks`), as a GPU manager that prefers
a chunk already holding the service would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from functools import partial

from tangram_bench.sim.cluster import Cluster
from tangram_bench.sim.costs import Costs
from tangram_bench.sim.durations import Durations
from tangram_bench.sim.policy import PolicyFactory, Shape, policy_factory
from tangram_bench.sim.pooled import Launch, PooledBackend, UnitPool
from tangram_bench.workloads.model import ActionSpec, Workload
from tangram_celery.scheduling import GpuPool, Pool, RunningJob, Start
from tangram_celery.scheduling.affinity import AffinityPolicy, cache_aware_chunks
from tangram_celery.scheduling.replicas import ReplicaConfig, ReplicaPolicy
from tangram_celery.scheduling.residency import Resident, plan_placement, service_name
from tangram_celery.scheduling.types import Service

Chunk = tuple[int, ...]


def services_of(workload: Workload, cluster: Cluster) -> tuple[Service, ...]:
    """The scheduler's view of the workload's GPU services: memory and restore per size."""
    return tuple(
        Service(s.name, tuple((d, s.memory_mb(d)) for d in s.dops),
                tuple((d, cluster.load_s(s, d)) for d in s.dops))
        for s in workload.services
    )


GPU_ABLATIONS: dict[str, ReplicaConfig] = {
    "replicas-no-affinity": ReplicaConfig(affinity=False),
    "replicas-no-backfill": ReplicaConfig(backfill=False),
    "replicas-no-backlog": ReplicaConfig(backlog_weight=0.0),
    "replicas-no-spare": ReplicaConfig(spare=False),
    "replicas-no-cap": ReplicaConfig(cap=None),
}
"""The service-aware scheduler with one idea switched off, to measure what each brings."""

CACHE_AWARE_POLICY = "affinity"
"""The GPU policy of the cache-aware pooled baselines (:mod:`tangram_celery.scheduling.affinity`:
the paper's allocator, resident first, with a delay bounded by the restore time)."""

GPU_POLICIES: dict[str, PolicyFactory] = {
    "replicas": ReplicaPolicy,
    CACHE_AWARE_POLICY: AffinityPolicy,
    **{name: partial(ReplicaPolicy, config) for name, config in GPU_ABLATIONS.items()},
}
"""Policies only GPU pools run (the service-aware scheduler and its ablations); run one as
``tangram:<name>`` (CPU nodes then keep tangram's default policy)."""


def gpu_policy_factory(name: str) -> PolicyFactory:
    """The factory of GPU policy ``name``: a GPU-only one, else any registered policy."""
    return GPU_POLICIES.get(name) or policy_factory(name)


class Residency:
    """Which services are loaded where; says when a start needs a restore. With
    ``cache_aware`` it also moves starts onto chunks holding their service
    (:func:`cache_aware_chunks`)."""

    def __init__(self, workload: Workload, cluster: Cluster,
                 running: Callable[[], Iterable[RunningJob]] = tuple,
                 cache_aware: bool = False) -> None:
        self.running = running
        self.cache_aware = cache_aware
        self.services = {service.name: service for service in workload.services}
        self.cluster = cluster
        self.memory_mb = int(cluster.gpu_memory_gb * 1000)
        self.residents: dict[str, Resident] = {}
        self.clock = 0
        self.loads = 0

    def place(self, starts: Sequence[tuple[Start, ActionSpec]],
              free: Sequence[int]) -> list[tuple[Chunk, float]]:
        """Each start on its chunk (the policy's, or the cache-aware one), with its restore
        time (0: resident). A service that is running (in an action, or a start placed
        before in this decision) is never unloaded."""
        chunks = [start.units for start, _ in starts]
        if self.cache_aware:
            chunks = cache_aware_chunks([(spec.service, start.units) for start, spec in starts],
                                        free, self.cluster.gpus, self.cluster.gpus_per_node,
                                        self.residents)
        running = {service_name(r.service, r.ids) for r in self.running() if r.ids}
        placed = []
        for (_, spec), chunk in zip(starts, chunks, strict=True):
            placed.append((chunk, self._load(spec, chunk, frozenset(running))))
            running.add(service_name(spec.service, chunk))
        return placed

    def _load(self, spec: ActionSpec, chunk: Chunk, pinned: frozenset[str]) -> float:
        service = self.services[spec.service]
        need = service.memory_mb(len(chunk))
        plan = plan_placement(self.residents, service.name, chunk, need, self.memory_mb, pinned)
        if not plan.fits:
            raise ValueError(f"service {service.name} needs {need} MB per GPU on "
                             f"{len(chunk)} GPUs; more than a GPU holds")
        self.clock += 1
        for name in plan.evict:
            del self.residents[name]
        if plan.name in self.residents:
            self.residents[plan.name] = replace(self.residents[plan.name], last_used=self.clock)
            return 0.0
        self.residents[plan.name] = Resident(plan.name, service.name, chunk, need, self.clock)
        self.loads += 1
        return self.cluster.load_s(service, len(chunk))


class GpuPooled(PooledBackend):
    """The GPU backend of the pooled systems: one pool of every GPU. Its policy sees the
    durations ``durations`` gives (learned per model and DoP from what the pool served, by
    default; :mod:`.durations`)."""

    resource = "gpu"

    def __init__(self, workload: Workload, cluster: Cluster, shape: Shape,
                 policy: PolicyFactory, costs: Costs, cache_aware: bool = False,
                 durations: Durations | None = None) -> None:
        total, size = cluster.gpus, cluster.gpus_per_node
        self.residency = Residency(workload, cluster, cache_aware=cache_aware)
        services = services_of(workload, cluster)
        memory = self.residency.memory_mb

        def view(free: tuple[int, ...]) -> Pool:
            return GpuPool("gpu", free, total, size, tuple(self.residency.residents.values()),
                           services, memory)

        pool = UnitPool("gpu", range(total), view, policy(), self.residency)
        self.residency.running = lambda: pool.running.values()
        super().__init__(workload, shape, costs.dispatch_s, [pool],
                         durations or Durations())

    def used(self, launch: Launch, finished: float) -> float:
        """GPU-seconds busy running (not restoring)."""
        return len(launch.units) * (finished - launch.started - launch.setup_s)
