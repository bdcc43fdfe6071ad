"""`decide_robust` against a plain version of itself, on random instances.

The fast path caches each job's plan view and queue entry on the job (`Job.memo`), keeps the
plan's timeline sorted as it grows (`backfill.Horizon`), builds the allocator's queue straight
from the plan (`robust.pool._queue`) and reads the DP's rows from the jobs' cached tick costs
(`ersa.rows._count_solver`). The plain version below does none of that: it is the robust policy
as first written (a view built per job and call, the timeline rebuilt at every look, the queue
reordered, bands, `settle` with its own queue building, DP rows converted per call). Every
decision must be the same, including on calls that find the caches filled by earlier calls
with other settings.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from operator import itemgetter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tangram_celery.scheduling import (
    Core,
    CpuPool,
    Decision,
    Demand,
    DemandConfig,
    Fcfs,
    GpuPool,
    Job,
    Outlook,
    RobustConfig,
    RunningJob,
    SchedulerConfig,
    ShortestFirst,
    Snapshot,
    decide,
    decide_robust,
    settle,
)
from tangram_celery.scheduling.backfill import (
    Busy,
    Held,
    Horizon,
    Plan,
    Shadow,
    Waiting,
    plan,
)
from tangram_celery.scheduling.backfill.admission import _reserve_for
from tangram_celery.scheduling.backfill.horizon import _timeline
from tangram_celery.scheduling.demand import NO_DEMAND, job_class
from tangram_celery.scheduling.ersa import rows
from tangram_celery.scheduling.robust import elastic_cap, reserve_units
from tangram_celery.scheduling.robust.pool import _bands, _cores, _reordered

NOW = 100.0
_UNITS = itemgetter(0)
_FASTEST = itemgetter(1, 0)


# --- the plain version ---------------------------------------------------------------------

def plain_plan(queue: Sequence[Waiting], busy: Sequence[Busy], total: int, free: int,
               reserve: int, now: float, backfill: bool = True) -> Plan:
    """`backfill.plan` as first written: the timeline rebuilt at every look."""
    held = Held(sum(b.units for b in busy if b.short), sum(b.units for b in busy if not b.short),
                free)
    chosen: list[Waiting] = []
    shadow: Shadow | None = None
    blocked = sum(not job.short for job in queue)
    for job in queue:
        blocked -= not job.short
        if shadow is None:
            own = _reserve_for(job, reserve, total)
            room = held.room(own, total)
            pick = job if len(job.options) == 1 else plain_best_start(
                job, busy, chosen, room, total, own, now, blocked)
            if pick.units <= room:
                held.take(pick)
                chosen.append(pick)
                continue
            if not backfill or job.overdue:
                return plain_result(chosen, pick, held, reserve, total)
            shadow = plain_shadow(pick, busy, chosen, total, own, now)
        elif job.short and job.units <= held.free and shadow.admits(job, now):
            held.take(job)
            chosen.append(job)
    return plain_result(chosen, shadow.head if shadow else None, held, reserve, total)


def plain_result(chosen: Sequence[Waiting], head: Waiting | None, held: Held, reserve: int,
                 total: int) -> Plan:
    return Plan(tuple((job.job_id, job.units) for job in chosen),
                None if head is None else (head.job_id, head.units),
                max(held.room(reserve, total), 0))


def plain_best_start(job: Waiting, busy: Sequence[Busy], chosen: Sequence[Waiting], room: int,
                     total: int, reserve: int, now: float, blocked: int) -> Waiting:
    options = job.options
    fitting = options if options[-1][0] <= room else \
        options[:bisect_right(options, room, key=_UNITS)]
    best = min(fitting, key=_FASTEST) if fitting else None
    if best is not None and best[0] == options[-1][0]:
        return job.held_to(options[0])
    timeline = _timeline(busy, chosen, now)
    finish = math.inf if best is None else now + best[1]
    at = 0
    for units, duration in options:
        if units <= room:
            continue
        while at < len(timeline) and \
                total - timeline[at][1] - max(timeline[at][2], reserve) < units:
            at += 1
        start = max(timeline[at][0], now) if at < len(timeline) else math.inf
        cost = start + duration + (start - now) * blocked
        if cost < finish:
            best, finish = (units, duration), cost
    assert best is not None
    return job.held_to(options[0] if best[0] <= room else best)


def plain_shadow(head: Waiting, busy: Sequence[Busy], chosen: Sequence[Waiting], total: int,
                 reserve: int, now: float) -> Shadow:
    for time, other, short in _timeline(busy, chosen, now):
        if total - other - max(short, reserve) >= head.units:
            return Shadow(head, time, short, other, reserve, total)
    raise AssertionError("an empty pool holds every job's counts")


def plain_waiting(job: Job, cap: int, now: float, config: RobustConfig) -> Waiting:
    if job.is_elastic and config.horizon:
        options = job.options[: max(bisect_right(job.options, cap, key=_UNITS), 1)]
    else:
        duration = job.options[0][1]
        fallback = config.base.fallback_duration
        options = ((job.minimum, fallback if duration is None else duration),)
    return Waiting(job.job_id, options,  # type: ignore[arg-type]
                   job_class(job, config.demand.short_s) == "short",
                   now - job.submitted_at >= config.max_bypass_s)


def plain_robust(snapshot: Snapshot, outlook: Outlook, config: RobustConfig) -> Decision:
    """`decide_robust` as first written (each part as `robust` documents it)."""
    ordered = config.base.ordering.order(snapshot.waiting, snapshot.now)
    names = {pool.name for pool in snapshot.pools}
    parts = []
    for pool in snapshot.pools:
        jobs = [job for job in ordered if job.key == pool.name]
        running = tuple(job for job in snapshot.running if job.key == pool.name)
        if not isinstance(pool, CpuPool):
            parts.append(settle(Snapshot(snapshot.now, tuple(jobs), (pool,), running), jobs,
                                config.base))
            continue
        demand = outlook.demand.get(pool.name, NO_DEMAND)
        reserve = reserve_units(demand, pool.total, config)
        cap = elastic_cap(demand, pool.total, config)
        queue = [plain_waiting(job, cap, snapshot.now, config) for job in jobs
                 if job.minimum <= pool.total]
        fallback = config.base.fallback_duration
        busy = [Busy(job.units, snapshot.now + fallback if job.expected_finish is None
                     else job.expected_finish, job.job_id in outlook.short_running)
                for job in running]
        chosen = plain_plan(queue, busy, pool.total, len(pool.free), reserve, snapshot.now,
                            config.backfill)
        head = None if chosen.head is None else chosen.head[0]
        order = _reordered(jobs, [job_id for job_id, _ in chosen.chosen], head)
        width = sum(units for _, units in chosen.chosen) + chosen.long_left
        view = CpuPool(pool.name, _cores(pool.free, width), pool.total)
        parts.append(settle(Snapshot(snapshot.now, tuple(order), (view,), running), order,
                            config.base, _bands(jobs, chosen, cap, pool.total)))
    lost = tuple(job.job_id for job in ordered if job.key not in names)
    return Decision(
        tuple(start for part in parts for start in part.starts),
        tuple(job for part in parts for job in part.deferred),
        tuple(job for part in parts for job in part.unplaceable) + lost,
        tuple(group for part in parts for group in part.groups),
    )


@contextmanager
def rows_converted_per_call() -> Iterator[None]:
    """The DP's rows converted from each entry's options (`ersa.rows._arrays`), not read from the
    jobs' cached tick costs."""
    fast = rows._count_solver
    rows._count_solver = lambda *args: None  # type: ignore[assignment]
    try:
        yield
    finally:
        rows._count_solver = fast


def outcome(call: object, *args: object) -> object:
    """The decision, or the error raised (both versions must fail alike on bad input)."""
    try:
        return call(*args)  # type: ignore[operator]
    except (ValueError, AssertionError, OverflowError) as error:
        return type(error)


# --- random instances ----------------------------------------------------------------------

durations = st.one_of(st.sampled_from([0.5, 1.0, 2.0, 4.0, 30.0, 90.0]), st.floats(0.01, 200.0))


@st.composite
def jobs(draw: st.DrawFn, i: int, total: int) -> Job:
    """Amdahl-shaped elastic jobs (some with gaps, unknown durations or beyond the pool),
    one-count jobs short and long (some unknown), two-count ones; waited 0-120 s."""
    kind = draw(st.integers(0, 5))
    at = NOW - draw(st.sampled_from([0.0, 1.0, 5.0, 59.9, 60.0, 61.0]) | st.floats(0, 120))
    if kind <= 2:
        t1, serial = draw(durations), draw(st.sampled_from([0.0, 0.1, 0.3, 0.6]))
        most = draw(st.integers(1, total + 2))
        least = draw(st.integers(1, max(1, min(most, 3))))
        step = draw(st.sampled_from([1, 1, 1, 2]))
        options: tuple[tuple[int, float | None], ...] = tuple(
            (u, t1 * (serial + (1 - serial) / u)) for u in range(least, most + 1, step))
        if draw(st.integers(0, 9)) == 0:
            options = options[:1] + tuple((u, None) for u, _ in options[1:])
        return Job(f"c{i}", "cpu", options, at, elastic=draw(st.integers(0, 9)) > 0)
    if kind <= 4:
        units = draw(st.integers(1, max(1, total // 2)))
        return Job(f"c{i}", "cpu", ((units, draw(st.none() | durations)),), at,
                   elastic=draw(st.booleans()))
    units = draw(st.integers(1, total + 1))
    return Job(f"c{i}", "cpu", ((units, draw(durations)), (units + 1, draw(durations))), at)


@st.composite
def instances(draw: st.DrawFn) -> tuple[Snapshot, Outlook]:
    total = draw(st.integers(2, 48))
    free = sorted(draw(st.sets(st.integers(0, total - 1), max_size=total)))
    groups = draw(st.integers(1, 4))
    pools: list[CpuPool | GpuPool] = [
        CpuPool("cpu", tuple(Core(c, c % groups) for c in free), total)]
    running = []
    left = total - len(free)
    while left > 0:
        units = draw(st.integers(1, left))
        finish = draw(st.none() | st.floats(NOW - 5, NOW + 100) | st.sampled_from([NOW + 1.0]))
        running.append(RunningJob(f"r{len(running)}", "cpu", units, finish))
        left -= units
    waiting = [draw(jobs(i, total)) for i in range(draw(st.integers(0, 40)))]
    if draw(st.integers(0, 4)) == 0:
        waiting.append(Job("lost", "nowhere", ((1, 1.0),), NOW))
    if draw(st.integers(0, 4)) == 0:
        pools.append(GpuPool("gpu", tuple(range(8)), 8))
        waiting += [Job(f"g{i}", "gpu", ((1, 2.0), (2, 1.1), (4, 0.7)), NOW - i)
                    for i in range(draw(st.integers(0, 4)))]
    rate = draw(st.sampled_from([0.0, 0.1, 1.0, 5.0, 50.0]))
    t1, serial = draw(durations), draw(st.sampled_from([0.05, 0.3]))
    curve = tuple(t1 * (serial + (1 - serial) / k) for k in range(1, total + 1))
    demand = Demand(rate, curve if draw(st.booleans()) else (),
                    draw(st.sampled_from([0.0, 0.5, 3.0, 10.0])),
                    draw(st.sampled_from([0.0, 2.0, 8.0])))
    short = frozenset(job.job_id for job in running if draw(st.booleans()))
    return Snapshot(NOW, tuple(waiting), tuple(pools), tuple(running)), Outlook({"cpu": demand},
                                                                                 short)


configs = st.builds(
    lambda cap, reserve, backfill, horizon, z, most, bypass, units, base, short: RobustConfig(
        base=base, demand=DemandConfig(short_s=short), cap=cap, reserve=reserve,
        backfill=backfill, horizon=horizon, reserve_z=z, max_reserve=most,
        max_bypass_s=bypass, max_units=units),
    st.booleans(), st.booleans(), st.booleans(), st.booleans(), st.sampled_from([0.0, 1.0]),
    st.sampled_from([0.0, 0.25, 0.5]), st.sampled_from([0.0, 5.0, 60.0]),
    st.sampled_from([None, 4, 16]),
    st.builds(SchedulerConfig, depth=st.integers(1, 3),
              fallback_duration=st.sampled_from([1.0, 30.0]),
              ordering=st.sampled_from([Fcfs(), ShortestFirst(max_wait=10.0)])),
    st.sampled_from([1.0, 10.0, 60.0]))


# --- the properties ------------------------------------------------------------------------

@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(), st.lists(configs, min_size=1, max_size=3))
def test_decisions_match_the_plain_version(instance: tuple[Snapshot, Outlook],
                                           chosen: list[RobustConfig]) -> None:
    """Cold and warm (the same jobs again, after other settings filled their caches)."""
    snapshot, outlook = instance
    for config in [*chosen, *chosen]:
        with rows_converted_per_call():
            expected = outcome(plain_robust, snapshot, outlook, config)
        assert outcome(decide_robust, snapshot, outlook, config) == expected


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(), configs)
def test_decide_reads_the_same_rows_from_the_cache(instance: tuple[Snapshot, Outlook],
                                                   config: RobustConfig) -> None:
    snapshot, _ = instance
    with rows_converted_per_call():
        expected = outcome(decide, snapshot, config.base)
    assert outcome(decide, snapshot, config.base) == expected


@st.composite
def timelines(draw: st.DrawFn) -> tuple[list[Busy], list[list[Waiting]]]:
    finishes = st.floats(NOW - 3, NOW + 20) | st.sampled_from([NOW, NOW + 1.0, NOW + 2.0])
    busy = [Busy(draw(st.integers(1, 4)), draw(finishes), draw(st.booleans()))
            for _ in range(draw(st.integers(0, 8)))]
    looks = draw(st.lists(st.lists(st.builds(
        lambda units, duration, short: Waiting("w", ((units, duration),), short),
        st.integers(1, 4), st.sampled_from([1.0, 2.0]) | st.floats(0.1, 20.0), st.booleans()),
        max_size=12), max_size=5))
    return busy, looks


@settings(max_examples=300, deadline=None)
@given(timelines(), st.booleans())
def test_the_horizon_is_the_timeline_rebuilt(case: tuple[list[Busy], list[list[Waiting]]],
                                             nan: bool) -> None:
    """Looked at while jobs are chosen in batches (equal finishes: by position), with or
    without a running job whose finish is NaN."""
    busy, batches = case
    if nan:
        busy.append(Busy(1, math.nan, False))
    chosen: list[Waiting] = []
    horizon = Horizon(busy, chosen, NOW)
    for batch in batches:
        chosen += batch
        timeline = _timeline(busy, chosen, NOW)
        other, short = timeline[0][1], timeline[0][2]
        assert list(horizon.points(other, short)) == timeline


def test_plan_is_the_plain_plan_on_a_busy_pool() -> None:
    """A fixed case with every branch: a reserve, a head that waits for more units, backfills
    that end in its shadow or leave it room, an overdue job."""
    queue = [Waiting("a", ((1, 8.0), (2, 4.0), (4, 2.0)), False),
             Waiting("b", ((3, 5.0),), False),
             Waiting("c", ((1, 0.5),), True),
             Waiting("d", ((2, 9.0), (4, 4.0), (8, 1.0)), False),
             Waiting("e", ((1, 3.0),), True),
             Waiting("f", ((1, 20.0),), True, True),
             Waiting("g", ((2, 1.0),), True)]
    busy = [Busy(2, NOW + 1.0, False), Busy(1, NOW + 3.0, True), Busy(2, NOW + 6.0, False)]
    for reserve in range(3):
        for backfill in (True, False):
            got = plan(queue, busy, 12, 7, reserve, NOW, backfill)
            assert got == plain_plan(queue, busy, 12, 7, reserve, NOW, backfill)


@pytest.mark.parametrize("horizon", [True, False])
def test_a_job_keeps_its_cached_view_across_calls(horizon: bool) -> None:
    """The same job object is planned alike on the second call, and the caches it carries
    are not part of its equality."""
    job = Job("a", "cpu", tuple((m, 8.0 / m) for m in range(1, 9)), NOW - 1.0)
    twin = Job("a", "cpu", job.options, job.submitted_at)
    snapshot = Snapshot(NOW, (job,), (CpuPool("cpu", tuple(Core(i) for i in range(8)), 8),))
    config = RobustConfig(horizon=horizon)
    first = decide_robust(snapshot, Outlook(), config)
    assert job.memo and job == twin
    assert decide_robust(snapshot, Outlook(), config) == first
    assert first == plain_robust(snapshot, Outlook(), config)
