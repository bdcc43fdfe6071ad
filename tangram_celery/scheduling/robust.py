"""The robust scheduler: the paper's allocator, steered by predicted demand (beyond the paper).

The paper's allocator (`ersa.decide`) is myopic: it gives every free unit to whoever waits now,
so under load later elastic jobs find the pool full, and short inelastic jobs wait behind long
ones holding many units. `decide_robust` keeps its DP and eviction, and changes what it is
given, from a `Demand` forecast per pool (see `demand`):

* **Load-aware DoP cap** (`dop_cap`): elastic jobs may take at most k units, k chosen from
  `CAPS` to minimise the predicted mean elastic ACT: an M/M/c queue whose servers are the
  units left to elastic work (the pool less the predicted short and long inelastic load,
  times `utilisation`) divided by k, whose service time is the mean expected duration at k
  and whose arrival rate is the predicted elastic rate (`predicted_act`). Light load: no cap;
  overload: the cap with the least load.
* **A reserve for short jobs** (`reserve_units`): ``ceil(a + z * sqrt(a))`` units, a the
  predicted units busy with short jobs (square-root staffing), at most `max_reserve` of the
  pool and never more than the forecast leaves idle with every elastic job at one unit (on a
  small node one rounded-up unit is a large share, and elastic work that alone fills the pool
  only queues longer), that long and elastic jobs leave free or held by short jobs.
* **Horizon start** (`backfill`): an elastic head that cannot get its cap now waits for more
  units only if that is expected to finish sooner, counting the wait once more for every
  non-short job it blocks; a head that starts now needs only its minimum (the paper's
  allocator then spreads the room up to the cap).
* **EASY backfilling with a starvation bound** (`backfill.plan`): short jobs may start ahead of
  a blocked head when that cannot delay its expected start; a head waiting `max_bypass_s` is
  overtaken by nothing.

The jobs chosen by the plan, and the units elastic jobs may share, are then handed to the
paper's allocator (`ersa.settle`), which spreads the long room over the elastic candidates with
its DP and eviction. Each idea has a switch (`RobustConfig`), so each can be measured alone.
Pools whose fit depends on topology (GPU chunks) get the paper's allocator unchanged.

* **Core loans** (`loans`, `RobustPolicy.lend`): a short job the decision leaves waiting
  starts at once on a core lent by a running job that is not short (an elastic test run, say)
  and stays queued; when the decision starts it, it moves onto its own cores
  (`tangram_celery.scheduling.loans`). Short jobs so never wait while some running job can
  spare a core, the decisions stay the ones above, and the lender runs slower while it lends.

`RobustPolicy` is the stateful callable the simulator and the node worker hold: it feeds a
`DemandTracker` and remembers which running jobs it started as short.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import cast

from tangram_celery.scheduling.backfill import (
    Busy,
    Choice,
    Plan,
    Waiting,
    choose,
    new_waiting,
)
from tangram_celery.scheduling.demand import (
    NO_DEMAND,
    Demand,
    DemandConfig,
    DemandTracker,
    job_class,
)
from tangram_celery.scheduling.ersa import (
    Band,
    Entry,
    Queue,
    SchedulerConfig,
    queue_entry,
    settle,
    settle_queue,
)
from tangram_celery.scheduling.loans import Holder, Loan, LoanConfig, plan_loans
from tangram_celery.scheduling.topology import CpuOperator
from tangram_celery.scheduling.types import (
    Core,
    CpuPool,
    Decision,
    Job,
    Option,
    Pool,
    Snapshot,
)


@dataclass(frozen=True)
class RobustConfig:
    """Settings of `decide_robust`.

    `base`: the paper's allocator's settings (depth, fallback duration, ordering).
    `demand`: the forecast's settings; its `short_s` also decides which jobs are short.
    `cap`, `reserve`, `backfill`, `horizon`: switch each idea on or off.
    `utilisation`: how many of the units left to elastic work the cap's queue model counts
    (above 1: the pool absorbs short bursts). `burstiness`: factor on the model's wait.
    `max_units`: a hard cap on any elastic job (None: none).
    `reserve_z`: safety factor of the reserve (standard deviations of short load).
    `max_reserve`: the largest share of a pool the reserve may take.
    `max_bypass_s`: after waiting this long a job is overtaken by nothing (starvation bound).
    `loans`: short jobs left waiting borrow cores of running jobs (`loan_config`).
    """

    base: SchedulerConfig = field(default_factory=SchedulerConfig)
    demand: DemandConfig = field(default_factory=DemandConfig)
    cap: bool = True
    reserve: bool = True
    backfill: bool = True
    utilisation: float = 1.2
    reserve_z: float = 0.0
    max_reserve: float = 0.5
    max_bypass_s: float = 60.0
    horizon: bool = True
    max_units: int | None = None
    burstiness: float = 4.0
    loans: bool = True

    def __post_init__(self) -> None:
        if not self.utilisation > 0 or not 0 <= self.max_reserve < 1:
            raise ValueError("utilisation must be positive and max_reserve in [0, 1)")
        if self.reserve_z < 0 or self.max_bypass_s < 0:
            raise ValueError("reserve_z and max_bypass_s must be >= 0")


@dataclass(frozen=True)
class Outlook:
    """What `decide_robust` knows beyond the snapshot: the demand forecast per pool name, and
    the running jobs that were started as short."""

    demand: Mapping[str, Demand] = field(default_factory=dict)
    short_running: frozenset[str] = frozenset()


def reserve_units(demand: Demand, total: int, config: RobustConfig) -> int:
    """Units kept for short jobs: square-root staffing of their predicted load, bounded."""
    load = demand.short_load
    if not config.reserve or load <= 0:
        return 0
    wanted = math.ceil(load + config.reserve_z * math.sqrt(load))
    return max(min(wanted, math.floor(config.max_reserve * total), _slack(demand, total)), 0)


def _slack(demand: Demand, total: int) -> int:
    """Units the forecast leaves idle with every elastic job at one unit (the least work)."""
    least = demand.elastic_rate * demand.elastic_time[0] if demand.elastic_time else 0.0
    return math.floor(total - demand.short_load - demand.long_load - least)


def loan_config(config: RobustConfig) -> LoanConfig:
    """The loan settings that go with `config`: the same short threshold and overdue age."""
    return LoanConfig(config.loans, config.demand.short_s, config.max_bypass_s,
                      fallback_s=config.base.fallback_duration)


CAPS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
"""The caps `dop_cap` chooses among."""


def dop_cap(demand: Demand, total: int, config: RobustConfig) -> int | None:
    """The cap with the least predicted elastic ACT, or None for no cap (see the module
    docstring)."""
    time, rate = demand.elastic_time, demand.elastic_rate
    if not config.cap or rate <= 0 or not time:
        return None
    room = max(total - demand.short_load - demand.long_load, 1.0) * config.utilisation
    caps = [cap for cap in CAPS if cap <= len(time)]
    acts = [predicted_act(rate, time[cap - 1], room / cap, config.burstiness) for cap in caps]
    best = caps[acts.index(min(acts))]
    return None if best >= len(time) else best


def predicted_act(rate: float, service: float, servers: float, burstiness: float = 1.0) -> float:
    """Mean time in an M/M/c queue with `servers` servers (Sakasegawa's approximation of the
    wait, times `burstiness`). Overloaded: a huge value growing with the load, so the least
    overloaded choice wins."""
    c = max(math.floor(servers), 1)
    rho = rate * service / c
    if rho >= 1:
        return OVERLOADED * rho
    wait: float = rho ** math.sqrt(2 * (c + 1)) / (c * (1 - rho)) * service * burstiness
    return service + wait


OVERLOADED = 1e12
"""Scale of `predicted_act` for an overloaded queue."""


def decide_robust(
    snapshot: Snapshot, outlook: Outlook | None = None, config: RobustConfig | None = None
) -> Decision:
    """Which waiting jobs start now, on which units (see the module docstring)."""
    config = config or RobustConfig()
    outlook = outlook or Outlook()
    ordered = config.base.ordering.order(snapshot.waiting, snapshot.now)
    names = {pool.name for pool in snapshot.pools}
    parts = [
        _pool_decision(snapshot, pool, [j for j in ordered if j.key == pool.name], outlook,
                       config)
        for pool in snapshot.pools
    ]
    lost = tuple(job.job_id for job in ordered if job.key not in names)
    return Decision(
        tuple(start for part in parts for start in part.starts),
        tuple(job for part in parts for job in part.deferred),
        tuple(job for part in parts for job in part.unplaceable) + lost,
        tuple(group for part in parts for group in part.groups),
    )


def _pool_decision(
    snapshot: Snapshot, pool: Pool, jobs: list[Job], outlook: Outlook, config: RobustConfig
) -> Decision:
    """One pool: plan the starts at minimums, then let the paper's allocator spread units."""
    if not isinstance(pool, CpuPool):
        running = tuple(job for job in snapshot.running if job.key == pool.name)
        return settle(Snapshot(snapshot.now, tuple(jobs), (pool,), running), jobs, config.base)
    demand = outlook.demand.get(pool.name, NO_DEMAND)
    reserve = reserve_units(demand, pool.total, config)
    cap = elastic_cap(demand, pool.total, config)
    now, total = snapshot.now, pool.total
    placeable = [job for job in jobs if job.minimum <= total]
    queue = _views(placeable, cap, now, config)
    fallback = config.base.fallback_duration
    short_running = outlook.short_running
    busy = [
        Busy(job.units, now + fallback if job.expected_finish is None else job.expected_finish,
             job.job_id in short_running)
        for job in snapshot.running if job.key == pool.name
    ]
    choice = choose(queue, busy, total, len(pool.free), reserve, now, config.backfill)
    width = sum(map(_UNITS_OF, choice.chosen)) + choice.long_left
    operator = CpuOperator(pool if width >= len(pool.free) else
                           CpuPool(pool.name, _cores(pool.free, width), total))
    built = _queue(jobs, placeable, choice, cap, operator)
    return settle_queue(snapshot, config.base, built, {pool.name: operator})


def elastic_cap(demand: Demand, total: int, config: RobustConfig) -> int:
    """The most units any elastic job may get under the forecast: the DoP cap (`dop_cap`;
    the pool if none), within `max_units`."""
    cap = dop_cap(demand, total, config)
    most = min(total, config.max_units or total)
    return most if cap is None else min(cap, most)


def _bands(jobs: Sequence[Job], chosen: Plan, cap: int, total: int) -> dict[str, Band]:
    """The units the allocator may give the chosen jobs and the head: from what the plan
    holds them to up to the cap if elastic (up to the pool if not)."""
    held = [*chosen.chosen, *([chosen.head] if chosen.head else [])]
    elastic = {job.job_id for job in jobs if job.is_elastic}
    return {job_id: (units, cap if job_id in elastic else total) for job_id, units in held}


def _queue(jobs: Sequence[Job], placeable: Sequence[Job], choice: Choice, cap: int,
           operator: CpuOperator) -> Queue:
    """The allocator's queue for the plan: what `build_queue` builds from the `_reordered`
    jobs with their `_bands` (the chosen jobs in queue order, the head, the rest), each job's
    entry cached on the job (`Job.memo`).

    Every job the plan chooses is held at its minimum (the plan's views start at it, and a
    chosen view is itself or held to its first count), so a chosen job's band is (its
    minimum, the cap if elastic, else the pool): its entry depends on the job, the pool's
    size and the cap alone. The chosen jobs fit (the view has their minimums and the long
    room left), so they are the first candidates; `_fitting` goes on from there."""
    total = operator.pool.total
    usable = operator.usable
    at, later = choice.at, choice.later
    key = f"{_ENTRY}:{total}:{cap}"
    held_to = (cap, total)  # a chosen job's band: (its minimum, the cap if elastic, else total)
    first = [_entry(job, key, usable, None, held_to) for job in placeable[:at]]
    if choice.head is not None:
        first += [_entry(placeable[i], key, usable, None, held_to) for i in later]
        job = placeable[at]
        band = (choice.head.units, cap if job.is_elastic else total)
        held = [_entry(job, "", usable, band)]
        skip = set(later)
        key = f"{_ENTRY}:{total}"
        held += [_entry(job, key, usable, None)
                 for i, job in enumerate(placeable[at + 1 :], at + 1) if i not in skip]
    else:
        held = []
    entries = (*first, *held)
    unplaceable = () if len(placeable) == len(jobs) else tuple(
        job.job_id for job in jobs if job.minimum > total)
    left = len(operator.pool.free) - sum(map(_MINIMUM, first))
    candidates = len(first)
    for entry in entries[candidates:]:  # `_fitting` past the chosen jobs (they fit)
        if entry.options[0][0] > left:
            break
        left -= entry.options[0][0]
        candidates += 1
    return Queue(entries, candidates, unplaceable)


def _entry(job: Job, key: str, usable: Callable[[tuple[Option, ...]], tuple[Option, ...]],
           band: Band | None, held_to: tuple[int, int] | None = None) -> Entry:
    """`queue_entry(job, usable, band)` of a placeable job, cached on the job under `key`
    (naming what the entry depends on besides the job; "": not cached). `held_to`: (cap,
    pool size) of a chosen job, whose band is (its minimum, the cap if it is elastic, else
    the pool size).

    The cached entry refers to its job, a reference cycle: a job that leaves the queue is
    freed by the cycle collector rather than at once. Rebuilding the entry from its parts at
    every call instead costs about 0.15 ms at 256 chosen jobs (new tuples, collections)."""
    entry = job.memo.get(key) if key else None
    if entry is not None:
        return cast(Entry, entry)
    if held_to is not None:
        band = (job.minimum, held_to[0] if job.is_elastic else held_to[1])
    entry = queue_entry(job, usable, band)
    if entry is None:
        raise AssertionError(f"job {job.job_id!r} is placeable")
    if key:
        job.memo[key] = entry
    return entry


_UNITS = itemgetter(0)
_UNITS_OF = attrgetter("units")
_MINIMUM = attrgetter("minimum")
_ENTRY = "robust.entry"
_WAITING = "robust.waiting"
"""Keys of what `decide_robust` caches in `Job.memo`."""


def _views(jobs: Sequence[Job], cap: int, now: float, config: RobustConfig) -> list[Waiting]:
    """The plan's view of each job (`_view`), cached on the job (`Job.memo`) under what it
    depends on besides the job: so a job that stays queued keeps its view and what the plan
    derives from it."""
    key = (f"{_WAITING}:{config.horizon}:{config.demand.short_s!r}:"
           f"{config.base.fallback_duration!r}:{cap}")
    fresh, late = f"{key}:0", f"{key}:1"
    bypass = config.max_bypass_s
    views = []
    for job in jobs:
        overdue = now - job.submitted_at >= bypass
        memo = job.memo
        view = memo.get(late if overdue else fresh)
        if view is None:
            view = memo[late if overdue else fresh] = _view(job, cap, overdue, config)
        views.append(view)
    return cast(list[Waiting], views)


def _view(job: Job, cap: int, overdue: bool, config: RobustConfig) -> Waiting:
    if job.is_elastic and config.horizon:
        options = job.options[: max(bisect_right(job.options, cap, key=_UNITS), 1)]
    else:
        duration = job.options[0][1]
        fallback = config.base.fallback_duration
        options = ((job.minimum, fallback if duration is None else duration),)
    return new_waiting(
        job.job_id,
        cast(tuple[tuple[int, float], ...], options),  # elastic: every duration is known
        job_class(job, config.demand.short_s) == "short",
        overdue,
    )


def _reordered(jobs: Sequence[Job], chosen: Sequence[str], head: str | None) -> list[Job]:
    """The chosen jobs in queue order, then the head, then everyone else in queue order: the
    allocator's candidate prefix is then exactly the chosen jobs."""
    picked = set(chosen)
    first = [job for job in jobs if job.job_id in picked]
    rest = [job for job in jobs if job.job_id not in picked]
    rest.sort(key=lambda job: job.job_id != head)
    return first + rest


def _cores(free: Sequence[Core], count: int) -> tuple[Core, ...]:
    """`count` free cores, taken from the NUMA groups with the most free cores first (the
    reserve stays in the fragmented groups)."""
    if count >= len(free):
        return tuple(free)
    groups: dict[int, list[Core]] = {}
    for core in free:
        groups.setdefault(core.numa, []).append(core)
    ranked = sorted(groups.values(), key=lambda cores: (-len(cores), cores[0].numa))
    return tuple(core for cores in ranked for core in cores)[:count]


class RobustPolicy:
    """The robust scheduler with its state: a callable from `Snapshot` to `Decision`.

    It feeds a `DemandTracker` with every snapshot and remembers which of the jobs it started
    are short, so the reserve can count them; the decision itself is `decide_robust`.
    """

    def __init__(self, config: RobustConfig | None = None) -> None:
        self.config = config or RobustConfig()
        self.tracker = DemandTracker(self.config.demand)
        self.short_running: set[str] = set()

    def __call__(self, snapshot: Snapshot) -> Decision:
        """The decision for one scheduling point."""
        demand = self.tracker.observe(snapshot)
        self.short_running &= {job.job_id for job in snapshot.running}
        outlook = Outlook(demand, frozenset(self.short_running))
        decision = decide_robust(snapshot, outlook, self.config)
        short_s = self.config.demand.short_s
        started = {start.job_id for start in decision.starts}
        self.short_running |= {job.job_id for job in snapshot.waiting
                               if job.job_id in started and job_class(job, short_s) == "short"}
        return decision

    def lend(self, waiting: Sequence[Job], holders: Sequence[Holder], now: float,
             may_borrow: Collection[str] | None = None) -> tuple[Loan, ...]:
        """Loans for the short jobs among `waiting` (left waiting by the last decision; only
        those in `may_borrow`, if given) from the running `holders`; the jobs it started as
        short never lend (`loans.plan_loans`)."""
        holders = [h if h.job_id not in self.short_running or not h.lends else
                   Holder(h.job_id, h.units, h.expected_finish, h.lent, False) for h in holders]
        return plan_loans(waiting, holders, now, loan_config(self.config), may_borrow)
