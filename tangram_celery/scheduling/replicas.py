"""Service-aware GPU scheduling: cache affinity, replica scaling and backfilling (beyond the paper).

On a GPU pool every (model, parallelism) is its own service, and a chunk serves an action
without a restore only if that service is resident on exactly that chunk (see `residency`).
The paper's allocator hands out chunks by size alone, in strict FCFS order: a request for a
whole node blocks everyone behind it, and an action often lands on a chunk where its service
is not loaded, so it pays a restore that a replica freeing up a moment later would have saved.

`decide_replicas` plans one pool's queue in FCFS order, **conservatively**: each job in turn
books the option with the least *cost* among

* **its service's replicas** at an allowed parallelism (cache affinity): a replica runs the job
  when its GPUs are free of running work and of the jobs booked on it before (FCFS per replica),
  with no restore;
* **a restore** of its service onto an aligned chunk of an allowed size (replica scaling): it
  starts when the chunk is free, takes the service's restore time, and unloads the
  least-recently-used residents there that memory requires (`plan_placement`, exactly as the
  GPU manager will; never a service that is running). A chunk whose plan would unload a
  replica an earlier job has booked is not used.

The cost of an option is its expected completion (start + restore + run) plus the *backlog
term*: the GPU-seconds it holds (restore included) times the jobs queued behind it per GPU of
the pool, times `backlog_weight` — each GPU-second one job takes delays the queue behind it by
about that much in all, so under load jobs prefer fewer GPUs and no restore, and with an empty
queue they take the fastest option. A restore that unloads a service that later jobs of the
queue ask for also pays that service's restore time.

**Load-aware DoP cap** (`ReplicaPolicy`, `gpu_cap`): from a forecast of the pool's demand and
the jobs already queued, jobs may take at most the chunk size with the least predicted mean
ACT, so a pool that restored large replicas at light load moves to small ones, the most
throughput per GPU, when a burst comes.

Jobs whose booking starts now start. A later job may start now only on GPUs that no earlier
booking needs before it is expected to finish (**backfilling**), so with right estimates
nothing overtakes a job and delays it; a running job past its expected finish counts as ending
any moment, so nothing backfills in front of it. **Starvation bound:** a job that has waited
`max_bypass_s` is *overdue*: no later job may start on the GPUs of its booking at all, so it
starts as soon as the work running there ends, whatever the estimates.

Pure: plain data in (`Snapshot` whose GPU pools carry residents and services, jobs naming their
`service`, running jobs their GPU ids), a `Decision` out. Pools that are not GPU pools are
left to the paper's allocator (`ersa.settle`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tangram_celery.scheduling.demand import Demand, DemandTracker
from tangram_celery.scheduling.ersa import SchedulerConfig, settle
from tangram_celery.scheduling.residency import Chunk, Resident, plan_placement, service_name
from tangram_celery.scheduling.robust import RobustConfig, predicted_act
from tangram_celery.scheduling.types import (
    Decision,
    GpuPool,
    Job,
    Option,
    Pool,
    RunningJob,
    Service,
    Snapshot,
    Start,
)

OVERRUN_S = 1e-6
"""When a running job past its expected finish is expected to end: any moment, not now."""
UNLIMITED_MB = 1 << 60
"""GPU memory of a pool that does not model it (residents never need evicting)."""


@dataclass(frozen=True)
class ReplicaConfig:
    """Settings of `decide_replicas`.

    `backlog_weight`: scale of the backlog term (0: every job takes its earliest completion).
    `max_bypass_s`: a job waiting this long is overtaken on its GPUs by nothing.
    `window`: the most jobs planned per pool at one point (the rest wait for the next).
    `fallback_duration`: seconds assumed where a duration or a running finish is unknown.
    `default_restore_s`: restore time of a service the pool does not describe.
    `base`: the paper's allocator's settings, for pools that are not GPU pools.
    `cap`: the settings of `ReplicaPolicy`'s load-aware DoP cap (None: no cap).
    `affinity`, `backfill`, `spare`: switch off waiting for a busy replica (a job then takes
    the best chunk free now), starting later jobs before a waiting one (strict FCFS), and the
    penalty for unloading a service later jobs need, to measure what each idea brings.
    """

    backlog_weight: float = 1.0
    max_bypass_s: float = 60.0
    window: int = 256
    fallback_duration: float = 1.0
    default_restore_s: float = 0.0
    base: SchedulerConfig = field(default_factory=SchedulerConfig)
    affinity: bool = True
    backfill: bool = True
    spare: bool = True
    cap: RobustConfig | None = field(default_factory=lambda: RobustConfig(utilisation=1.0))

    def __post_init__(self) -> None:
        if self.backlog_weight < 0 or self.max_bypass_s < 0 or self.default_restore_s < 0:
            raise ValueError("backlog_weight, max_bypass_s and default_restore_s must be >= 0")
        if self.window < 1 or not self.fallback_duration > 0:
            raise ValueError("window must be >= 1 and fallback_duration positive")


@dataclass(frozen=True)
class Booking:
    """Where and when one job is planned to run: on `chunk` from `start`, restoring its service
    first for `restore` seconds (0: resident), then running `duration` seconds; `cost` is what
    the plan minimised."""

    job_id: str
    chunk: Chunk
    start: float
    restore: float
    duration: float
    cost: float
    evict: tuple[str, ...] = ()

    @property
    def finish(self) -> float:
        """Expected completion."""
        return self.start + self.restore + self.duration


class Board:
    """The GPUs of one pool during planning: when each is free for good (after running and
    booked work), which are free now, and until when a free GPU stays idle (the start of the
    first booking on it: the hole a later job may fill)."""

    def __init__(self, pool: GpuPool, running: Sequence[RunningJob], now: float,
                 fallback: float) -> None:
        self.now = now
        free = set(pool.free)
        self.open = [gpu in free for gpu in range(pool.total)]
        self.avail = [now if gpu in free else now + fallback for gpu in range(pool.total)]
        """When each GPU is free for good; a GPU busy now is never free before `now`."""
        self.idle_until = [math.inf] * pool.total
        for job in running:
            finish = now + fallback if job.expected_finish is None else job.expected_finish
            for gpu in job.ids:
                if not self.open[gpu]:
                    self.avail[gpu] = max(finish, now + OVERRUN_S)
        self.open_count = len(free)

    def start_time(self, chunk: Chunk, length: float) -> float:
        """The earliest start of `length` seconds of work on `chunk`: now if every GPU of it is
        free now and stays idle that long, else when its last GPU is free for good."""
        now, opened, idle = self.now, self.open, self.idle_until
        end = now + length
        for gpu in chunk:
            if not opened[gpu] or idle[gpu] < end:
                break
        else:
            return now
        avail, latest = self.avail, now
        for gpu in chunk:
            if avail[gpu] > latest:
                latest = avail[gpu]
        return latest

    def book(self, chunk: Chunk, start: float, length: float) -> None:
        """Hold `chunk` from `start` for `length` seconds."""
        if start <= self.now:
            for gpu in chunk:
                self.open[gpu] = False
                self.avail[gpu] = max(self.avail[gpu], self.now + length)
            self.open_count -= len(chunk)
            return
        for gpu in chunk:
            self.idle_until[gpu] = min(self.idle_until[gpu], start)
            self.avail[gpu] = start + length

    def close(self, chunk: Chunk) -> None:
        """No later job may start now on `chunk` (the booking of an overdue job)."""
        for gpu in chunk:
            self.idle_until[gpu] = self.now


def aligned_chunks(total: int, units: int) -> list[Chunk]:
    """Every aligned chunk of `units` GPUs of a pool of `total` (never across a node when
    `units` is at most the node size, both powers of two)."""
    return [tuple(range(first, first + units)) for first in range(0, total, units)]


class Planner:
    """One pool's plan at one scheduling point (see the module docstring)."""

    def __init__(self, pool: GpuPool, jobs: Sequence[Job], running: Sequence[RunningJob],
                 now: float, config: ReplicaConfig, cap: int | None = None) -> None:
        self.pool = pool
        self.cap = cap
        self.now = now
        self.config = config
        self.board = Board(pool, running, now, config.fallback_duration)
        self.services = {service.name: service for service in pool.services}
        self.memory = pool.memory_mb or UNLIMITED_MB
        self.actual = {r.name: r for r in pool.residents}
        self.planned = dict(self.actual)
        self.busy_pins = frozenset(service_name(r.service, r.ids) for r in running
                                   if r.service and r.ids)
        self.booked: set[str] = set()
        self.later = Counter(job.service for job in jobs)
        self.tick = max((r.last_used for r in pool.residents), default=0)
        self.jobs = jobs
        self._chunks: dict[int, list[Chunk]] = {}
        self._occupied: dict[bool, frozenset[int]] = {}
        self._replicas: dict[tuple[str, int], list[Resident]] = {}
        self.bookings: dict[str, Booking] = {}
        self._restore: dict[tuple[str, int], float] = {}
        self._memory: dict[tuple[str, int], int] = {}

    def run(self) -> tuple[list[Start], list[str]]:
        """The starts (in queue order) and the jobs no chunk of the pool can ever serve."""
        starts: list[Start] = []
        unplaceable: list[str] = []
        for index, job in enumerate(self.jobs):
            if self.board.open_count <= 0 or index >= self.config.window:
                break
            self.later[job.service] -= 1
            if not self.servable(job):
                unplaceable.append(job.job_id)
                continue
            overdue = self.now - job.submitted_at >= self.config.max_bypass_s
            booking = self.best(job, len(self.jobs) - index - 1)
            if booking is None:
                if overdue:
                    break
                continue
            self.commit(job, booking)
            if booking.start <= self.now:
                starts.append(Start(job.job_id, self.pool.name, booking.chunk, booking.duration))
            elif not self.config.backfill:
                break
            elif overdue:
                self.board.close(booking.chunk)
        return starts, unplaceable

    def servable(self, job: Job) -> bool:
        """Whether some option of `job` is an aligned chunk whose memory fits a GPU."""
        return any(units <= self.pool.node_size and not units & (units - 1)
                   and self.memory_mb(job.service, units) <= self.memory
                   for units, _ in job.options)

    def best(self, job: Job, behind: int) -> Booking | None:
        """The least-cost booking of `job`, or None if no option fits the pool."""
        best: Booking | None = None
        best_key: tuple[float, ...] = (math.inf,)
        for units, expected in capped(job.options, self.cap):
            if units > self.pool.node_size or units & (units - 1):
                continue
            duration = self.config.fallback_duration if expected is None else expected
            for option in self.options(job, units, duration, behind, best_key[0]):
                key = (option.cost, option.restore > 0, len(option.evict), units,
                       option.chunk[0])
                if key < best_key:
                    best, best_key = option, key
        return best

    def backlog(self, behind: int, units: int, length: float) -> float:
        """The backlog term of holding `units` GPUs for `length` seconds: the GPU-seconds
        times the jobs queued behind per GPU of the pool."""
        return self.config.backlog_weight * behind * units * length / self.pool.total

    def options(self, job: Job, units: int, duration: float, behind: int,
                bound: float) -> list[Booking]:
        """The bookings of `job` on `units` GPUs worth comparing: every replica of its
        service at that size, and restores that could beat `bound`."""
        found = []
        run_cost = self.backlog(behind, units, duration)
        for resident in self.replicas(job.service, units):
            start = self.board.start_time(resident.chunk, duration)
            if start > self.now and not self.config.affinity:
                continue
            cost = start + duration + run_cost
            found.append(Booking(job.job_id, resident.chunk, start, 0.0, duration, cost))
            bound = min(bound, cost)
        restore = self.restore_s(job.service, units)
        length = restore + duration
        restore_cost = self.backlog(behind, units, length)
        if self.now + length + restore_cost > bound:
            return found
        resident_chunks = {r.chunk for r in self.replicas(job.service, units)}
        candidates = sorted((self.board.start_time(chunk, length), chunk)
                            for chunk in self.chunks(units) if chunk not in resident_chunks)
        for start, chunk in candidates:
            cost = start + length + restore_cost
            if cost > bound:
                break
            if not job.service or self.occupied(start).isdisjoint(chunk):
                found.append(Booking(job.job_id, chunk, start, restore, duration, cost))
                break
            evicted = self.evictions(job.service, chunk, units, start)
            if evicted is None:
                continue
            cost += sum(self.penalty(resident) for resident in evicted)
            found.append(Booking(job.job_id, chunk, start, restore, duration, cost,
                                 tuple(r.name for r in evicted)))
            bound = min(bound, cost)
        return found

    def chunks(self, units: int) -> list[Chunk]:
        """The pool's aligned chunks of `units` GPUs."""
        cached = self._chunks.get(units)
        if cached is None:
            cached = self._chunks[units] = aligned_chunks(self.pool.total, units)
        return cached

    def occupied(self, start: float) -> frozenset[int]:
        """The GPUs holding a resident in the view a start at `start` plans with."""
        now = start <= self.now
        cached = self._occupied.get(now)
        if cached is None:
            view = self.actual if now else self.planned
            cached = self._occupied[now] = frozenset(g for r in view.values() for g in r.chunk)
        return cached

    def replicas(self, service: str, units: int) -> list[Resident]:
        """The planned residents of `service` on chunks of `units` GPUs."""
        if not service:
            return []
        cached = self._replicas.get((service, units))
        if cached is None:
            cached = self._replicas[(service, units)] = [
                r for r in self.planned.values() if r.model == service and len(r.chunk) == units
            ]
        return cached

    def restore_s(self, service: str, units: int) -> float:
        """Seconds to restore `service` onto `units` GPUs (0 for a job without a service)."""
        key = (service, units)
        cached = self._restore.get(key)
        if cached is None:
            known = self.services.get(service, Service(service)).restore_at(units)
            cached = self._restore[key] = (
                0.0 if not service else self.config.default_restore_s if known is None
                else known)
        return cached

    def memory_mb(self, service: str, units: int) -> int:
        """Memory per GPU `service` needs on `units` GPUs."""
        key = (service, units)
        cached = self._memory.get(key)
        if cached is None:
            cached = self._memory[key] = (
                self.services.get(service, Service(service)).memory_at(units))
        return cached

    def evictions(self, service: str, chunk: Chunk, units: int,
                  start: float) -> list[Resident] | None:
        """The residents restoring `service` on `chunk` unloads, as the GPU manager will plan
        it; None if it does not fit or would unload a replica an earlier job has booked."""
        if not service:
            return []
        view = self.actual if start <= self.now else self.planned
        placement = plan_placement(view, service, chunk, self.memory_mb(service, units),
                                   self.memory, self.busy_pins)
        if not placement.fits or self.booked.intersection(placement.evict):
            return None
        return [view[name] for name in placement.evict]

    def penalty(self, resident: Resident) -> float:
        """What unloading `resident` costs the queue: its restore time if later jobs ask for
        its service."""
        if self.later[resident.model] <= 0 or not self.config.spare:
            return 0.0
        return self.restore_s(resident.model, len(resident.chunk))

    def commit(self, job: Job, booking: Booking) -> None:
        """Book `booking`: hold its GPUs and, for a restore, update the residents."""
        self.bookings[job.job_id] = booking
        self.board.book(booking.chunk, booking.start, booking.restore + booking.duration)
        if not job.service:
            return
        name = service_name(job.service, booking.chunk)
        if booking.start <= self.now:
            self.busy_pins |= {name}
        self.tick += 1
        views = [self.planned, self.actual] if booking.start <= self.now else [self.planned]
        if booking.evict or any(name not in view for view in views):
            self._occupied.clear()
            self._replicas.clear()
        for view in views:
            for evicted in booking.evict:
                view.pop(evicted, None)
            view[name] = Resident(name, job.service, booking.chunk,
                                  self.memory_mb(job.service, len(booking.chunk)), self.tick)
        self.booked.add(name)


def capped(options: Sequence[Option], cap: int | None) -> Sequence[Option]:
    """The options of at most `cap` units (the smallest one if none is that small)."""
    if cap is None:
        return options
    kept = [option for option in options if option[0] <= cap]
    return kept or options[:1]


def decide_replicas(snapshot: Snapshot, config: ReplicaConfig | None = None,
                    caps: Mapping[str, int | None] | None = None) -> Decision:
    """Which waiting jobs start now, on which GPUs (see the module docstring); `caps` limits
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
