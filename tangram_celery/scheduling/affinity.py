"""Cache-aware FCFS for pooled GPU baselines: resident first, with a bounded delay (pure).

A pooled baseline that runs every GPU action at one fixed size (a fixed DoP, or plain Celery's
minimum) goes through the paper's allocator in FCFS order, which hands a freed chunk to the
head of the queue whatever is loaded there, so most starts restore a service. The classic
fixes, without any of tangram's planning, are locality-first ordering and delay scheduling
(Zaharia et al., EuroSys 2010): at each decision

* **hits** go first (FCFS among them): jobs whose service is resident, at the job's size, on a
  chunk that is free now;
* a **miss** whose service is resident at its size only on busy GPUs waits for that replica
  while it has waited less than the service's restore time there (waiting at most what a
  restore costs, then restoring, is the ski-rental rule);
* every other job follows in FCFS order.

The allocator then admits the candidates it always would (`ersa.settle`); a placement that
prefers resident chunks (the simulator's ``cache_aware``) puts hits on their replicas. A held
job is reconsidered at the next decision (a replica of its service frees, or anything
arrives), so its wait is bounded by its restore time plus one inter-event gap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tangram_celery.scheduling.ersa import SchedulerConfig, settle
from tangram_celery.scheduling.types import Decision, GpuPool, Job, Snapshot


@dataclass(frozen=True)
class AffinityPolicy:
    """The cache-aware FCFS policy of the pooled GPU baselines (see `affinity`)."""

    config: SchedulerConfig = field(default_factory=SchedulerConfig)

    def __call__(self, snapshot: Snapshot) -> Decision:
        """The allocator's decision on the queue in cache-aware order."""
        ordered = self.config.ordering.order(snapshot.waiting, snapshot.now)
        pools = {pool.name: pool for pool in snapshot.pools if isinstance(pool, GpuPool)}
        if not pools:
            return settle(snapshot, ordered, self.config)
        return settle(snapshot, affinity_order(ordered, pools, snapshot.now), self.config)


def affinity_order(ordered: tuple[Job, ...], pools: dict[str, GpuPool],
                   now: float) -> tuple[Job, ...]:
    """Hits first, then the jobs that need not wait; held misses are left out."""
    views = {name: _View(pool) for name, pool in pools.items()}
    hits: list[Job] = []
    rest: list[Job] = []
    for job in ordered:
        view = views.get(job.key)
        verdict = GO if view is None or not job.service else view.verdict(job, now)
        if verdict == HIT:
            hits.append(job)
        elif verdict == GO:
            rest.append(job)
    return (*hits, *rest)


HIT, GO, HOLD = "hit", "go", "hold"


class _View:
    """One GPU pool's replicas by (service, size), which of them are free, restore times."""

    def __init__(self, pool: GpuPool) -> None:
        free = set(pool.free)
        self.replicas: dict[tuple[str, int], bool] = {}
        for resident in pool.residents:
            key = (resident.model, len(resident.chunk))
            self.replicas[key] = self.replicas.get(key, False) or free.issuperset(resident.chunk)
        self.restore = {(s.name, size): seconds for s in pool.services
                        for size, seconds in s.restore_s}

    def verdict(self, job: Job, now: float) -> str:
        """HIT (a replica is free), HOLD (wait for a busy one) or GO."""
        key = (job.service, job.minimum)
        free = self.replicas.get(key)
        if free:
            return HIT
        restore = self.restore.get(key)
        if free is None or restore is None:
            return GO
        return HOLD if now - job.submitted_at < restore else GO
