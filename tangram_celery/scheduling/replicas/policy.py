"""The service-aware scheduler's entry points: `decide_replicas` over every pool, and
`ReplicaPolicy`, which caps each job's GPUs from predicted demand (`gpu_cap`)."""

from __future__ import annotations

from collections.abc import Mapping

from tangram_celery.scheduling.demand import Demand, DemandTracker
from tangram_celery.scheduling.ersa import settle
from tangram_celery.scheduling.replicas.config import ReplicaConfig
from tangram_celery.scheduling.replicas.planner import Planner
from tangram_celery.scheduling.robust import RobustConfig, predicted_act
from tangram_celery.scheduling.types import Decision, GpuPool, Pool, Snapshot, Start


def decide_replicas(snapshot: Snapshot, config: ReplicaConfig | None = None,
                    caps: Mapping[str, int | None] | None = None) -> Decision:
    """Which waiting jobs start now, on which GPUs (see `replicas`); `caps` limits
    the GPUs of a job on each pool (`ReplicaPolicy` derives them from predicted demand)."""
    config = config or ReplicaConfig()
    caps = caps or {}
    starts: list[Start] = []
    unplaceable: list[str] = []
    others: list[Pool] = []
    for pool in snapshot.pools:
        if not isinstance(pool, GpuPool):
            others.append(pool)
            continue
        jobs = sorted((j for j in snapshot.waiting if j.key == pool.name),
                      key=lambda j: j.submitted_at)
        running = [r for r in snapshot.running if r.key == pool.name]
        planned, lost = Planner(pool, jobs, running, snapshot.now, config,
                                caps.get(pool.name)).run()
        starts.extend(planned)
        unplaceable.extend(lost)
    names = {pool.name for pool in snapshot.pools}
    unplaceable.extend(j.job_id for j in snapshot.waiting if j.key not in names)
    if not others:
        return Decision(tuple(starts), (), tuple(unplaceable))
    keys = {pool.name for pool in others}
    rest = [j for j in snapshot.waiting if j.key in keys]
    part = settle(Snapshot(snapshot.now, tuple(rest), tuple(others),
                           tuple(r for r in snapshot.running if r.key in keys)), rest, config.base)
    return Decision((*starts, *part.starts), part.deferred, (*unplaceable, *part.unplaceable),
                    part.groups)


class ReplicaPolicy:
    """`decide_replicas` with its state: a callable from `Snapshot` to `Decision`.

    With `ReplicaConfig.cap` it forecasts each pool's demand (`DemandTracker`) and caps every
    job's GPUs with a load-aware DoP cap (`gpu_cap`, the robust scheduler's queue model plus
    the backlog): light load, no cap (jobs take the fastest option); heavy load, the smallest
    chunks, the most throughput per GPU. Without it a pool keeps the parallelism its first,
    light-load replicas were restored at, however loaded it becomes.
    """

    def __init__(self, config: ReplicaConfig | None = None) -> None:
        self.config = config or ReplicaConfig()
        self.tracker = DemandTracker(self.config.cap.demand if self.config.cap else None)

    def __call__(self, snapshot: Snapshot) -> Decision:
        """The decision for one scheduling point."""
        caps: dict[str, int | None] = {}
        if self.config.cap is not None:
            for name, demand in self.tracker.observe(snapshot).items():
                total = next(p.total for p in snapshot.pools if p.name == name)
                queued = sum(1 for job in snapshot.waiting if job.key == name)
                caps[name] = gpu_cap(demand, total, self.config.cap, queued)
        return decide_replicas(snapshot, self.config, caps)


def gpu_cap(demand: Demand, total: int, config: RobustConfig, queued: int = 0) -> int | None:
    """The chunk size (a power of two) with the least predicted mean ACT, or None for no cap:
    the robust scheduler's queue model (`robust.predicted_act`: arrivals at the forecast
    elastic rate on `total / k` servers of the mean expected duration at k) plus the time
    the `queued` jobs already waiting take to drain through those servers (on average half
    of it each), so a backlog moves the cap to the most throughput at once instead of when
    the arrival-rate forecast catches up."""
    time, rate = demand.elastic_time, demand.elastic_rate
    if rate <= 0 or not time:
        return None
    room = max(total - demand.short_load - demand.long_load, 1.0) * config.utilisation
    caps = [1 << i for i in range(len(time).bit_length()) if 1 << i <= len(time)]
    acts = [predicted_act(rate, time[k - 1], room / k, config.burstiness)
            + queued * time[k - 1] / max(room / k, 1.0) / 2 for k in caps]
    best = caps[acts.index(min(acts))]
    return None if best >= len(time) else best
