"""Queue orderings, and that no provided policy lets a job wait forever."""

from __future__ import annotations

import math

import pytest

from tangram_celery.scheduling import (
    Core,
    CpuPool,
    Fcfs,
    Job,
    Ordering,
    RunningJob,
    SchedulerConfig,
    ShortestFirst,
    Snapshot,
    decide,
)
from tangram_celery.scheduling.ordering import trajectory_order_key


def job(job_id: str, duration: float | None, at: float, units: int = 1) -> Job:
    return Job(job_id, "cpu", ((units, duration),), submitted_at=at)


def ids(jobs: tuple[Job, ...]) -> list[str]:
    return [j.job_id for j in jobs]


def test_fcfs_orders_by_submission_and_keeps_ties_in_order() -> None:
    jobs = [job("b", 1.0, 2.0), job("a", 1.0, 1.0), job("c", 1.0, 2.0)]
    assert ids(Fcfs().order(jobs, 3.0)) == ["a", "b", "c"]


def test_shortest_first_puts_aged_jobs_first_then_short_ones() -> None:
    jobs = [
        job("old-long", 9.0, 0.0),
        job("long", 8.0, 5.0),
        job("unknown", None, 6.0),
        job("short", 1.0, 7.0),
        job("older-long", 9.0, -1.0),
    ]
    order = ShortestFirst(max_wait=8.0).order(jobs, 8.5)
    assert ids(order) == ["older-long", "old-long", "short", "long", "unknown"]


SHORT_EVERY = 0.45  # two cores serve 2 short jobs/s; 2.2/s arrive, so shorts always queue
SHORT_RUNS = 1.0
LONG_ARRIVES = 0.25


def long_job_start(ordering: Ordering, horizon: float = 60.0) -> float | None:
    """Event-driven run of `decide` on 2 cores; when does the 2-core long job start?"""
    arrivals = [(SHORT_EVERY * i, job(f"s{i}", SHORT_RUNS, SHORT_EVERY * i)) for i in range(200)]
    arrivals.append((LONG_ARRIVES, job("long", 5.0, LONG_ARRIVES, units=2)))
    arrivals.sort(key=lambda pair: pair[0])
    running: dict[str, tuple[float, tuple[int, ...]]] = {}
    waiting: list[Job] = []
    now = 0.0
    config = SchedulerConfig(ordering=ordering)
    while now <= horizon:
        waiting += [j for t, j in arrivals if t <= now and j not in waiting]
        arrivals = [(t, j) for t, j in arrivals if t > now]
        running = {k: v for k, v in running.items() if v[0] > now}
        busy = {core for _, cores in running.values() for core in cores}
        pool = CpuPool("cpu", tuple(Core(c) for c in range(2) if c not in busy), 2)
        holding = tuple(RunningJob(k, "cpu", len(c), f) for k, (f, c) in running.items())
        decision = decide(Snapshot(now, tuple(waiting), (pool,), holding), config)
        for start in decision.starts:
            if start.job_id == "long":
                return now
            assert start.expected_duration is not None
            running[start.job_id] = (now + start.expected_duration, start.units)
        started = {start.job_id for start in decision.starts}
        waiting = [j for j in waiting if j.job_id not in started]
        now = min([f for f, _ in running.values()] + [t for t, _ in arrivals[:1]])
    return None


POLICIES: list[tuple[Ordering, float]] = [
    (Fcfs(), 0.0),
    (ShortestFirst(max_wait=5.0), 5.0),
    (ShortestFirst(max_wait=20.0, unknown_duration=0.0), 20.0),
]


@pytest.mark.parametrize(("ordering", "max_wait"), POLICIES)
def test_no_provided_policy_starves_a_long_job(ordering: Ordering, max_wait: float) -> None:
    start = long_job_start(ordering)
    assert start is not None, "the long job never started"
    # It reaches the head within max_wait, then waits at most for one short job to finish.
    assert start <= LONG_ARRIVES + max_wait + SHORT_RUNS + 1e-9


def test_the_starvation_check_can_fail() -> None:
    """Shortest-first without aging does starve the long job: the check above would catch it."""
    assert long_job_start(ShortestFirst(max_wait=math.inf)) is None


# ------------------------------------------------------------ oldest trajectory first (APIs)

TRAJECTORY_ORDER = [
    # (case, first seen, arrived, bypass_s, key)
    ("a trajectory's later call keeps its trajectory's place", 10.0, 40.0, 60.0, 10.0),
    ("the first call ranks by its own arrival", 40.0, 40.0, 60.0, 40.0),
    ("past the bypass bound a call ranks by arrival less the bound", 10.0, 100.0, 60.0, 40.0),
    ("bypass 0 is FCFS by arrival", 10.0, 40.0, 0.0, 40.0),
    ("a first-seen time after the arrival (clock skew) counts as the arrival", 50.0, 40.0, 60.0,
     40.0),
]


@pytest.mark.parametrize(("case", "first", "arrived", "bypass", "key"), TRAJECTORY_ORDER,
                         ids=[c[0] for c in TRAJECTORY_ORDER])
def test_trajectory_order_key(case: str, first: float, arrived: float, bypass: float,
                              key: float) -> None:
    assert trajectory_order_key(first, arrived, bypass) == key


def test_an_older_trajectory_overtakes_and_the_bypass_bound_holds() -> None:
    old, new = 0.0, 5.0  # when each trajectory was first seen
    waiting = trajectory_order_key(new, 5.0, 60.0)  # the new trajectory's call, queued at 5 s
    assert trajectory_order_key(old, 6.0, 60.0) < waiting, "an old trajectory's later call"
    assert trajectory_order_key(old, 66.0, 60.0) > waiting, "not once the bound has passed"
    assert trajectory_order_key(old, 6.0, 0.0) > waiting, "bypass 0: FCFS"


def test_no_call_is_overtaken_by_calls_arriving_later_than_the_bound() -> None:
    bypass = 30.0
    calls = [(first, first + step) for first in (0.0, 7.0, 19.0, 50.0)
             for step in (0.0, 3.0, 29.0, 31.0, 90.0)]
    for first_a, a in calls:
        for first_b, b in calls:
            if b > a + bypass:
                assert trajectory_order_key(first_b, b, bypass) > \
                    trajectory_order_key(first_a, a, bypass)


def test_a_negative_bypass_is_refused() -> None:
    with pytest.raises(ValueError, match="bypass_s"):
        trajectory_order_key(0.0, 1.0, -1.0)
