"""The robust scheduler on plain data: each idea changes the decision where it should, the
starvation bound holds however many short jobs arrive, and it is the default everywhere."""

from __future__ import annotations

import pytest

from tangram_bench.sim.policy import DEFAULT_POLICY
from tangram_celery.scheduling import (
    Core,
    CpuPool,
    Decision,
    Demand,
    DemandConfig,
    DemandTracker,
    GpuPool,
    Job,
    Outlook,
    RobustConfig,
    RobustPolicy,
    RunningJob,
    Snapshot,
    decide,
    decide_robust,
    settle,
)
from tangram_celery.scheduling.robust import dop_cap, predicted_act, reserve_units
from tangram_celery.settings import SCHEDULERS, Settings

CPU = "cpu"


def amdahl(job_id: str, t1: float, parallel: float, most: int, at: float = 0.0) -> Job:
    options = tuple((m, t1 * ((1 - parallel) + parallel / m)) for m in range(1, most + 1))
    return Job(job_id, CPU, options, submitted_at=at)


def fixed(job_id: str, units: int, duration: float, at: float = 0.0) -> Job:
    return Job(job_id, CPU, ((units, duration),), submitted_at=at, elastic=False)


def pool(free: int, total: int | None = None) -> CpuPool:
    return CpuPool(CPU, tuple(Core(i) for i in range(free)), total or free)


def busy_pool(free: tuple[int, ...], total: int) -> CpuPool:
    return CpuPool(CPU, tuple(Core(i) for i in free), total)


def units(decision: Decision) -> dict[str, int]:
    return {start.job_id: start.count for start in decision.starts}


ONLY_CAP = RobustConfig(reserve=False, backfill=False, horizon=False)
ONLY_BACKFILL = RobustConfig(cap=False, reserve=False, horizon=False)
ONLY_RESERVE = RobustConfig(cap=False, backfill=False, horizon=False)
ONLY_HORIZON = RobustConfig(cap=False, reserve=False, backfill=False)


def curve(t1: float, parallel: float, width: int) -> tuple[float, ...]:
    return tuple(t1 * ((1 - parallel) + parallel / k) for k in range(1, width + 1))


# --- load-aware DoP cap -------------------------------------------------------------------

@pytest.mark.parametrize(
    ("rate", "want"),
    [
        (0.0, 64),  # nothing predicted: the paper's allocator gives every free core
        (0.05, 64),  # light: still no cap
        (0.2, 24),  # some load: a high cap
        (1.0, 12),
        (2.0, 4),  # busy: a low one
        (40.0, 1),  # overloaded at every cap: the least loaded one, the minimum
    ],
)
def test_the_cap_follows_predicted_elastic_demand(rate: float, want: int) -> None:
    demand = Demand(elastic_rate=rate, elastic_time=curve(20.0, 0.9, 64))
    job = amdahl("a", 20.0, 0.9, 64)
    snapshot = Snapshot(0.0, (job,), (pool(64),))
    decision = decide_robust(snapshot, Outlook({CPU: demand}), ONLY_CAP)
    assert units(decision) == {"a": want}
    assert units(decide(snapshot)) == {"a": 64}


def test_the_cap_is_the_least_predicted_act() -> None:
    demand = Demand(elastic_rate=2.0, elastic_time=curve(20.0, 0.9, 64))
    config = RobustConfig()
    room = 64 * config.utilisation
    acts = {k: predicted_act(2.0, demand.elastic_time[k - 1], room / k, config.burstiness)
            for k in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)}
    assert dop_cap(demand, 64, config) == min(acts, key=acts.__getitem__) == 4


def test_queue_model_waits_grow_with_load() -> None:
    assert predicted_act(0.0, 2.0, 4) == 2.0
    light, heavy = predicted_act(1.0, 2.0, 4), predicted_act(1.9, 2.0, 4)
    assert 2.0 < light < heavy < predicted_act(5.0, 2.0, 4)


# --- reserve for short jobs ---------------------------------------------------------------

def test_the_reserve_keeps_cores_from_elastic_jobs() -> None:
    demand = Demand(short_load=3.0)
    job = amdahl("a", 10.0, 0.95, 8)
    snapshot = Snapshot(0.0, (job,), (pool(8),))
    assert reserve_units(demand, 8, ONLY_RESERVE) == 3
    assert units(decide_robust(snapshot, Outlook({CPU: demand}), ONLY_RESERVE)) == {"a": 5}
    assert units(decide_robust(snapshot, Outlook(), ONLY_RESERVE)) == {"a": 8}


def test_short_holders_count_against_the_reserve_and_short_jobs_backfill_into_it() -> None:
    """10 cores, 3 reserved, 2 held by a running job: a long job needing 7 fits only if that
    running job is known to be short (its cores are reserve cores); if not, a short job
    behind the blocked long job may still start, into the reserve."""
    demand = Demand(short_load=3.0)
    running = (RunningJob("s0", CPU, 2, 5.0),)
    free = busy_pool(tuple(range(2, 10)), 10)
    snapshot = Snapshot(0.0, (fixed("long", 7, 90.0), fixed("short", 1, 0.3, at=1)), (free,),
                        running)
    known = Outlook({CPU: demand}, frozenset({"s0"}))
    unknown = Outlook({CPU: demand})
    assert units(decide_robust(snapshot, known, ONLY_RESERVE)) == {"long": 7, "short": 1}
    assert units(decide_robust(snapshot, unknown, ONLY_RESERVE)) == {}
    both = RobustConfig(cap=False, horizon=False)
    assert units(decide_robust(snapshot, unknown, both)) == {"short": 1}


# --- EASY backfilling ---------------------------------------------------------------------

def backfill_case(short_duration: float) -> Snapshot:
    """8 cores, 6 held until t = 10; the head needs all 8; a short job waits behind it."""
    running = (RunningJob("r", CPU, 6, 10.0),)
    waiting = (fixed("head", 8, 100.0), fixed("short", 1, short_duration, at=1.0))
    return Snapshot(2.0, waiting, (busy_pool((6, 7), 8),), running)


@pytest.mark.parametrize(
    ("short_duration", "starts"),
    [(3.0, {"short": 1}), (8.0, {"short": 1}), (8.5, {}), (9.5, {})],
)
def test_a_short_job_backfills_only_if_it_cannot_delay_the_head(
    short_duration: float, starts: dict[str, int]
) -> None:
    """The head can start at t = 10 at the earliest; a short job started at t = 2 must end by
    then (8 s) or it would hold a core the head needs."""
    snapshot = backfill_case(short_duration)
    assert units(decide_robust(snapshot, Outlook(), ONLY_BACKFILL)) == starts
    assert units(decide(snapshot)) == {}, "the paper's FCFS prefix stops at the head"
    no_backfill = RobustConfig(cap=False, reserve=False, backfill=False, horizon=False)
    assert units(decide_robust(snapshot, Outlook(), no_backfill)) == {}


def test_extra_units_at_the_shadow_time_take_any_short_job() -> None:
    """The head needs 6 of 8 cores at t = 10, so 2 cores are spare then: two short jobs that
    outlast t = 10 may backfill, the third may not."""
    running = (RunningJob("r", CPU, 6, 10.0),)
    waiting = (fixed("head", 6, 100.0), *(fixed(f"s{i}", 1, 9.0, at=1.0 + i) for i in range(3)))
    snapshot = Snapshot(2.0, waiting, (busy_pool((6, 7), 8),), running)
    assert units(decide_robust(snapshot, Outlook(), ONLY_BACKFILL)) == {"s0": 1, "s1": 1}


def test_an_overdue_head_is_overtaken_by_nothing() -> None:
    snapshot = backfill_case(3.0)
    waited = RobustConfig(cap=False, reserve=False, horizon=False, max_bypass_s=1.0)
    assert units(decide_robust(snapshot, Outlook(), waited)) == {}


def test_long_jobs_never_overtake_the_head() -> None:
    running = (RunningJob("r", CPU, 6, 10.0),)
    waiting = (fixed("head", 8, 100.0), fixed("long", 1, 120.0, at=1.0))
    snapshot = Snapshot(2.0, waiting, (busy_pool((6, 7), 8),), running)
    assert units(decide_robust(snapshot, Outlook(), ONLY_BACKFILL)) == {}


# --- horizon start ------------------------------------------------------------------------

def test_an_elastic_head_waits_for_more_cores_when_that_finishes_sooner() -> None:
    """2 cores free now, 6 more at t = 0.5: on 2 cores it would take 5.05 s, on 8 cores it
    finishes at 0.5 + 1.4 = 1.9 s."""
    running = (RunningJob("r", CPU, 6, 0.5),)
    head = amdahl("a", 10.0, 0.99, 8)
    snapshot = Snapshot(0.0, (head,), (busy_pool((6, 7), 8),), running)
    assert units(decide_robust(snapshot, Outlook(), ONLY_HORIZON)) == {}
    myopic = RobustConfig(cap=False, reserve=False, backfill=False, horizon=False)
    assert units(decide_robust(snapshot, Outlook(), myopic)) == {"a": 2}
    later = Snapshot(0.0, (head,), (busy_pool((6, 7), 8),), (RunningJob("r", CPU, 6, 20.0),))
    assert units(decide_robust(later, Outlook(), ONLY_HORIZON)) == {"a": 2}



# --- small nodes: where the old decisions were too conservative ------------------------------

def test_an_elastic_head_does_not_wait_while_other_elastic_jobs_queue_behind_it() -> None:
    """8 cores, 2 free now and 6 more at t = 0.3. Alone, the head finishes sooner waiting for
    4 (0.3 + 1.22 s) than on 2 now (1.74 s), as the old horizon chose; but its wait also
    blocks the two elastic jobs behind it (0.3 s each), so it starts now and the DP spreads
    the two free cores."""
    options = ((1, 2.8), (2, 1.74), (4, 1.22))
    jobs = tuple(Job(name, CPU, options, submitted_at=0.0) for name in "abc")
    running = (RunningJob("r", CPU, 6, 0.3),)
    alone = Snapshot(0.0, jobs[:1], (busy_pool((6, 7), 8),), running)
    assert units(decide_robust(alone, Outlook(), ONLY_HORIZON)) == {}
    queued = Snapshot(0.0, jobs, (busy_pool((6, 7), 8),), running)
    assert sum(units(decide_robust(queued, Outlook(), ONLY_HORIZON)).values()) == 2


def test_a_head_that_fits_now_leaves_the_spread_to_the_papers_allocator() -> None:
    """An idle 8-core node, cap 4, three elastic jobs: the old horizon forced the head to its
    cap (4, then 3 and 1 by queue order); starting now, each needs only its minimum, and the
    paper's allocator spreads the cores (4 or fewer each, all eight busy)."""
    options = tuple((k, 2.8 / k ** 0.6) for k in range(1, 9))
    jobs = tuple(Job(name, CPU, options, submitted_at=0.0) for name in "abc")
    snapshot = Snapshot(0.0, jobs, (pool(8),))
    config = RobustConfig(cap=False, reserve=False, backfill=False, max_units=4)
    got = units(decide_robust(snapshot, Outlook(), config))
    assert set(got) == {"a", "b", "c"} and max(got.values()) <= 4 and sum(got.values()) == 8
    assert got != {"a": 4, "b": 3, "c": 1}


def test_no_reserve_when_elastic_work_alone_fills_the_pool() -> None:
    """8 cores, 0.5 units of short load, elastic work of 3/s x 2.8 s at one core each (8.4
    units): the old ceil(0.5) = 1 reserved core (an eighth of the node) only made the elastic
    queue longer; the reserve never takes units the forecast needs."""
    busy = Demand(elastic_rate=3.0, elastic_time=(2.8, 1.74), short_load=0.5)
    assert reserve_units(busy, 8, RobustConfig()) == 0
    assert reserve_units(Demand(elastic_rate=1.0, elastic_time=(2.8, 1.74), short_load=0.5),
                         8, RobustConfig()) == 1
    assert reserve_units(Demand(short_load=3.0), 8, RobustConfig()) == 3

# --- the starvation bound -----------------------------------------------------------------

def run_until_head_starts(config: RobustConfig, every: float, actual: float,
                          horizon: float = 400.0) -> float:
    """4 cores; at t = 0 a long job takes 3 of them for 5 s and the head (all 4 cores, 2 s)
    arrives; short jobs arrive every `every` seconds forever, each expected to take 0.5 s
    but really taking `actual` s (so backfilling on expectations keeps getting it wrong).
    Returns when the head starts."""
    policy = RobustPolicy(config)
    pool_units = set(range(4))
    running: dict[str, tuple[float, tuple[int, ...]]] = {"first": (5.0, (0, 1, 2))}
    waiting = [fixed("head", 4, 2.0, at=0.0)]
    now, count = 0.0, 0
    while now < horizon:
        free = tuple(sorted(pool_units - {u for _, us in running.values() for u in us}))
        snapshot = Snapshot(now, tuple(waiting), (busy_pool(free, 4),), tuple(
            RunningJob(job_id, CPU, len(us), now + 0.5 if job_id != "first" else end)
            for job_id, (end, us) in running.items()))
        for start in policy(snapshot).starts:
            if start.job_id == "head":
                return now
            running[start.job_id] = (now + actual, start.units)
            waiting = [job for job in waiting if job.job_id != start.job_id]
        next_arrival = (count + 1) * every
        next_finish = min((end for end, _ in running.values()), default=float("inf"))
        now = min(next_arrival, next_finish)
        running = {k: v for k, v in running.items() if v[0] > now}
        if now == next_arrival:
            count += 1
            waiting.append(fixed(f"s{count}", 1, 0.5, at=now))
    return float("inf")


@pytest.mark.parametrize("every", [0.05, 0.2, 1.0])
@pytest.mark.parametrize("actual", [0.5, 3.0, 20.0])
@pytest.mark.parametrize("bypass", [0.0, 10.0, 30.0])
def test_the_head_starts_within_the_bound_however_many_short_jobs_arrive(
    every: float, actual: float, bypass: float
) -> None:
    """Bound: the head is overtaken by nothing once it has waited `max_bypass_s`; then it waits
    at most for the jobs already running, each at most the longest actual run (here
    max(5, actual) s for the first job and the short ones)."""
    config = RobustConfig(max_bypass_s=bypass, demand=DemandConfig(short_s=1.0))
    started = run_until_head_starts(config, every, actual)
    assert started <= bypass + max(5.0, actual)


def test_without_the_bound_wrong_estimates_starve_the_head() -> None:
    """The same run with no bypass limit: short jobs keep outlasting their estimates, so
    backfilling on expectations delays the head for ever (here past 400 s)."""
    config = RobustConfig(max_bypass_s=1e9, demand=DemandConfig(short_s=1.0))
    assert run_until_head_starts(config, 0.2, 3.0) == float("inf")


# --- plumbing -------------------------------------------------------------------------------

def test_gpu_pools_get_the_papers_allocator() -> None:
    gpus = GpuPool("gpu", tuple(range(8)), 8)
    jobs = tuple(Job(f"g{i}", "gpu", ((1, 4.0), (2, 2.2), (4, 1.3)), float(i)) for i in range(3))
    snapshot = Snapshot(5.0, jobs, (gpus,))
    assert decide_robust(snapshot, Outlook({"gpu": Demand(elastic_rate=9.0)})) == decide(snapshot)


def test_settle_holds_elastic_jobs_to_their_bands() -> None:
    jobs = (amdahl("a", 8.0, 0.9, 8), amdahl("b", 8.0, 0.9, 8, at=1.0))
    snapshot = Snapshot(2.0, jobs, (pool(16),))
    assert units(settle(snapshot, jobs, RobustConfig().base)) == units(decide(snapshot))
    banded = settle(snapshot, jobs, RobustConfig().base, {"a": (3, 4), "b": (6, 6)})
    assert units(banded) == {"a": 4, "b": 6}


def test_unknown_pools_are_unplaceable() -> None:
    stray = Job("x", "elsewhere", ((1, 1.0),), 0.0)
    assert decide_robust(Snapshot(0.0, (stray,), (pool(4),))).unplaceable == ("x",)


def test_the_tracker_forecasts_rates_and_loads() -> None:
    tracker = DemandTracker(DemandConfig(short_s=1.0, window_s=10.0))
    seen: list[Job] = []
    demand = Demand()
    for second in range(60):
        seen = [fixed(f"s{second}", 1, 0.5, at=second), amdahl(f"e{second}", 4.0, 0.5, 4,
                                                                 at=second)]
        demand = tracker.observe(Snapshot(float(second), tuple(seen), (pool(8),)))[CPU]
    assert demand.elastic_rate == pytest.approx(1.0, rel=0.1)
    assert demand.short_load == pytest.approx(0.5, rel=0.1)
    assert demand.elastic_time[:4] == pytest.approx(curve(4.0, 0.5, 4))
    assert demand.elastic_time[7] == pytest.approx(curve(4.0, 0.5, 4)[3])


def test_a_lone_elastic_job_on_an_idle_pool_gets_every_core() -> None:
    job = amdahl("a", 0.8, 0.9, 4)
    assert units(RobustPolicy()(Snapshot(0.0, (job,), (pool(4),)))) == {"a": 4}


def test_robust_is_the_default() -> None:
    assert Settings().node.scheduler == "robust" and "elastic" in SCHEDULERS
    assert DEFAULT_POLICY == "robust"

