"""`decide` on small hand-checked cases: plain data in, plain data out.

Objectives are sums of ACTs in seconds; every figure in the comments is worked out by hand
from the definition (DESIGN.md section 3).
"""

from __future__ import annotations

import pytest

from tangram_celery.scheduling import (
    Core,
    CpuPool,
    Decision,
    GpuPool,
    GroupOutcome,
    Job,
    Option,
    RunningJob,
    SchedulerConfig,
    ShortestFirst,
    Snapshot,
    Start,
    decide,
    options_from_elasticity,
)

CPU = "cpu"


def job(
    job_id: str, *options: Option, at: float = 0.0, key: str = CPU, elastic: bool = True
) -> Job:
    return Job(job_id, key, tuple(options), submitted_at=at, elastic=elastic)


def cores(free: int, total: int | None = None, numa_size: int = 64) -> CpuPool:
    return CpuPool(CPU, tuple(Core(i, i // numa_size) for i in range(free)), total or free)


def started(decision: Decision) -> dict[str, tuple[int, ...]]:
    return {start.job_id: start.units for start in decision.starts}


def test_fcfs_prefix_stops_at_the_first_job_that_does_not_fit() -> None:
    jobs = (job("a", (2, 1.0)), job("b", (3, 1.0), at=1), job("c", (1, 1.0), at=2))
    decision = decide(Snapshot(5.0, jobs, (cores(4),)))
    assert decision == Decision(starts=(Start("a", CPU, (0, 1), 1.0),))


def test_gpu_fit_is_judged_on_chunks_not_totals() -> None:
    """Two GPUs are free (5 and 6) but they are no aligned pair, so `b` blocks the queue."""
    pool = GpuPool("gpu", (0, 1, 2, 3, 5, 6), 8)
    jobs = (
        job("a", (4, 1.0), key="gpu"),
        job("b", (2, 1.0), key="gpu", at=1),
        job("c", (1, 1.0), key="gpu", at=2),
    )
    assert started(decide(Snapshot(5.0, jobs, (pool,)))) == {"a": (0, 1, 2, 3)}


def test_unknown_elasticity_and_unknown_durations_get_the_minimum() -> None:
    jobs = (
        job("fixed", (2, 3.0), (4, 1.0), elastic=False),
        job("unknown", (1, None), (2, None), at=1),
        job("half", (1, 2.0), (2, None), at=2),
    )
    decision = decide(Snapshot(5.0, jobs, (cores(8),)))
    assert started(decision) == {"fixed": (0, 1), "unknown": (2,), "half": (3,)}
    assert [s.expected_duration for s in decision.starts] == [3.0, None, 2.0]
    assert decision.groups == ()


@pytest.mark.parametrize(("free", "units"), [(4, (0, 1, 2, 3)), (3, (0, 1)), (1, (0,))])
def test_a_lone_elastic_job_gets_the_fastest_option_that_fits(
    free: int, units: tuple[int, ...]
) -> None:
    only = (job("a", (1, 8.0), (2, 4.0), (4, 2.0)),)
    decision = decide(Snapshot(0.0, only, (cores(free, total=8),)))
    assert started(decision) == {"a": units}


def eviction_jobs(
    b_options: tuple[Option, ...], at: tuple[float, float] = (0.0, 0.0)
) -> tuple[Job, ...]:
    return (job("A", (1, 10.0), (2, 4.0), at=at[0]), job("B", *b_options, at=at[1]))


def test_evicting_the_last_candidate_when_it_lowers_the_total_act() -> None:
    # Both in: A 10 + B 1.5 = 11.5. Only A: A takes 2 cores (4), B starts at 4 (5.5): 9.5.
    decision = decide(Snapshot(0.0, eviction_jobs(((1, 1.5), (2, 1.5))), (cores(2),)))
    assert started(decision) == {"A": (0, 1)}
    assert decision.deferred == ("B",)
    assert decision.groups == (GroupOutcome(CPU, ("A", "B"), 1, (11.5, 9.5)),)


def test_keeping_everyone_when_eviction_does_not_strictly_help() -> None:
    # Both in: 10 + 1.5. Only A: A 2 cores -> 5, B waits until 5 -> 6.5; 11.5 is not < 11.5.
    jobs = (job("A", (1, 10.0), (2, 5.0)), job("B", (1, 1.5), (2, 1.5)))
    decision = decide(Snapshot(0.0, jobs, (cores(2),)))
    assert started(decision) == {"A": (0,), "B": (1,)}
    assert decision.groups == (GroupOutcome(CPU, ("A", "B"), 2, (11.5, 11.5)),)


def test_time_already_waited_counts_in_every_act() -> None:
    # As above with A waiting 2 s and B 1 s so far: both objectives grow by 3.
    jobs = eviction_jobs(((1, 1.5), (2, 1.5)), at=(-2.0, -1.0))
    decision = decide(Snapshot(0.0, jobs, (cores(2),)))
    assert decision.groups[0].objectives == (14.5, 12.5)


def test_running_jobs_seed_the_completion_heap() -> None:
    # Core 2 is busy until t=1. Only A: A 2 cores -> 4; B takes the core freed at 1 -> 2.5.
    pool = CpuPool(CPU, (Core(0), Core(1)), 3)
    running = (RunningJob("r", CPU, 1, 1.0),)
    decision = decide(Snapshot(0.0, eviction_jobs(((1, 1.5), (2, 1.5))), (pool,), running))
    assert decision.groups[0].objectives == (11.5, 6.5)


def test_overdue_and_unknown_finishes() -> None:
    # An overdue job frees its core now; one without an estimate after the fallback (3 s).
    pool = CpuPool(CPU, (Core(0), Core(1)), 4)
    running = (RunningJob("late", CPU, 1, -5.0), RunningJob("?", CPU, 1, None))
    config = SchedulerConfig(fallback_duration=3.0)
    decision = decide(Snapshot(0.0, eviction_jobs(((1, 1.5), (2, 1.5))), (pool,), running), config)
    # Only A: A 2 cores -> 4; B takes the overdue job's core at 0 -> 1.5.
    assert decision.groups[0].objectives == (11.5, 5.5)


@pytest.mark.parametrize(("depth", "objectives"), [(1, (13.0, 11.0)), (2, (13.0, 8.5))])
def test_depth_lets_the_first_waiting_job_try_more_units(
    depth: int, objectives: tuple[float, ...]
) -> None:
    # Only A: A 2 cores -> 4. B at 1 core starts at 4 -> 7; at 2 cores starts at 4 -> 4.5.
    jobs = eviction_jobs(((1, 3.0), (2, 0.5)))
    decision = decide(Snapshot(0.0, jobs, (cores(2),)), SchedulerConfig(depth=depth))
    assert decision.groups[0].objectives == objectives


def test_eviction_goes_on_down_to_the_head_of_the_queue() -> None:
    # All three at 1 core: 30 + 1 + 1 = 32. A, B: A 2 cores (6) + B 1, C at 1 core from t=1
    # (2): 9. A alone on 3 cores (2); B and C start at 2 and end at 3: 8. The head stays.
    jobs = (
        job("A", (1, 30.0), (2, 6.0), (3, 2.0)),
        job("B", (1, 1.0), (2, 1.0), (3, 1.0)),
        job("C", (1, 1.0), (2, 1.0), (3, 1.0)),
    )
    decision = decide(Snapshot(0.0, jobs, (cores(3),)))
    assert started(decision) == {"A": (0, 1, 2)}
    assert decision.deferred == ("B", "C")
    assert decision.groups[0].objectives == (32.0, 9.0, 8.0)


def test_unplaceable_jobs_are_reported_and_do_not_block() -> None:
    pools = (cores(4), GpuPool("gpu", tuple(range(8)), 8))
    jobs = (
        job("nowhere", (1, 1.0), key="tpu"),
        job("too-big", (5, 1.0), at=1),
        job("odd-gpus", (3, 1.0), key="gpu", at=2),
        job("gpu-four", (3, 1.0), (4, 0.5), key="gpu", at=3),
        job("fits", (1, 1.0), at=4),
    )
    decision = decide(Snapshot(10.0, jobs, pools))
    assert decision.unplaceable == ("nowhere", "too-big", "odd-gpus")
    assert started(decision) == {"gpu-four": (0, 1, 2, 3), "fits": (0,)}
    assert decision.starts[0].expected_duration == 0.5


def test_one_prefix_across_pools() -> None:
    """FCFS is global: a CPU job that does not fit holds back a later GPU job."""
    pools = (cores(1), GpuPool("gpu", tuple(range(8)), 8))
    jobs = (job("c1", (1, 1.0)), job("c2", (1, 1.0), at=1), job("g", (1, 1.0), key="gpu", at=2))
    assert started(decide(Snapshot(5.0, jobs, pools))) == {"c1": (0,)}


def test_ordering_policy_is_applied() -> None:
    jobs = (job("long", (2, 9.0)), job("short", (2, 1.0), at=1.0))
    snapshot = Snapshot(2.0, jobs, (cores(2),))
    assert started(decide(snapshot)) == {"long": (0, 1)}
    shortest = SchedulerConfig(ordering=ShortestFirst(max_wait=10.0))
    assert started(decide(snapshot, shortest)) == {"short": (0, 1)}
    aged = SchedulerConfig(ordering=ShortestFirst(max_wait=1.5))
    assert started(decide(snapshot, aged)) == {"long": (0, 1)}


def test_gpu_elastic_group_uses_buddy_chunks() -> None:
    # 8 free GPUs, three jobs allowed {1, 2, 4}: both ways of filling the node are hand-checked.
    jobs = tuple(job(n, (1, 8.0), (2, 4.0), (4, 2.0), key="gpu", at=i) for i, n in enumerate("xyz"))
    pool = GpuPool("gpu", tuple(range(8)), 8)
    decision = decide(Snapshot(3.0, jobs, (pool,)))
    # All three: best is 4 + 2 + 2 GPUs (2 + 4 + 4 = 10 s) with the last one smallest.
    assert started(decision) == {"x": (0, 1, 2, 3), "y": (4, 5), "z": (6, 7)}


def test_options_from_elasticity() -> None:
    assert options_from_elasticity([4, 1, 2], 8.0, lambda m: 1.0) == (
        (1, 8.0),
        (2, 4.0),
        (4, 2.0),
    )
    assert options_from_elasticity([1, 2], 8.0, None) == ((1, 8.0), (2, None))
    assert options_from_elasticity([2, 4], None, None) == ((2, None), (4, None))


@pytest.mark.parametrize(
    "options", [(), ((0, 1.0),), ((2, 1.0), (2, 0.5)), ((1, 0.0),), ((2, 1.0), (1, 2.0))]
)
def test_invalid_jobs_are_refused(options: tuple[Option, ...]) -> None:
    with pytest.raises(ValueError, match="job 'bad'"):
        Job("bad", CPU, options, 0.0)
