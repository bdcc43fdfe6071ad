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
prefers resident chunks (:func:`cache_aware_chunks`: the simulator's ``cache_aware`` pooled
baselines, and a GPU pool worker's ``--cache-aware``) puts hits on their replicas. A held
job is reconsidered at the next decision (a replica of its service frees, or anything
arrives), so its wait is bounded by its restore time plus one inter-event gap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tangram_celery.scheduling.ersa import SchedulerConfig, settle
from tangram_celery.scheduling.replicas.board import aligned_chunks
from tangram_celery.scheduling.residency import Chunk, Resident, service_name
from tangram_celery.scheduling.topology import free_chunks
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


def cache_aware_chunks(requests: Sequence[tuple[str, Chunk]], free: Sequence[int],
                       total: int, node_size: int,
                       residents: Mapping[str, Resident]) -> list[Chunk]:
    """Chunks for ``requests`` ((service, the policy's chunk) each) of the same sizes, placed
    largest first: a free chunk where the service is resident (the most recently used), else
    the policy's chunk while it is free, else the best-fit free chunk. Placing aligned
    power-of-two chunks largest first on any free aligned chunk leaves as many chunks of every
    smaller size as best fit does, so whatever fitted still fits."""
    available = set(free)
    placed: dict[int, Chunk] = {}
    for index in sorted(range(len(requests)), key=lambda i: -len(requests[i][1])):
        service, chunk = requests[index]
        size = len(chunk)
        fitting = [c for c in aligned_chunks(total, size) if available.issuperset(c)]
        resident = [(residents[name].last_used, c) for c in fitting
                    if (name := service_name(service, c)) in residents]
        if resident:
            choice = max(resident)[1]
        elif chunk in fitting:
            choice = chunk
        else:
            choice = _best_fit(available, total, node_size, size)
        available -= set(choice)
        placed[index] = choice
    return [placed[i] for i in range(len(requests))]


def _best_fit(available: set[int], total: int, node_size: int, size: int) -> Chunk:
    pool = GpuPool("fit", tuple(sorted(available)), total, node_size)
    spans = [(span, start) for start, span in free_chunks(pool) if span >= size]
    if not spans:
        raise ValueError(f"no free aligned chunk of {size} GPUs is left")
    _, start = min(spans)
    return tuple(range(start, start + size))
