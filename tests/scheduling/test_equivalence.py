"""`decide` against naive implementations written from the definition, on random instances.

Three implementations must agree on every decision and every objective value:

* `decide`: the prefix DP table (vectorised), the sparse objective, the bounded heap;
* `decide_reference` with its plain-Python DP recomputed at every eviction step;
* `decide_reference` with `enumerate_allocate` below: every allocation enumerated.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tangram_celery.scheduling import (
    Core,
    CpuPool,
    Fcfs,
    GpuPool,
    Job,
    Option,
    RunningJob,
    SchedulerConfig,
    ShortestFirst,
    Snapshot,
    decide,
)
from tangram_celery.scheduling.dp import CountSolver, State, StateSolver, ticks
from tangram_celery.scheduling.reference import Rows, decide_reference, python_dp
from tangram_celery.scheduling.topology import CpuOperator, Operator
from tangram_celery.scheduling.types import option_arrays

NOW = 10.0


def enumerate_allocate(operator: Operator, start: State, rows: Rows) -> tuple[int, ...]:
    """The optimal allocation by enumerating every combination of allowed options.

    Least total duration in ticks; ties go to the allocation whose option indices, read from
    the last candidate backwards, are smallest.
    """
    best: tuple[int, tuple[int, ...]] | None = None
    for combo in itertools.product(*(range(len(row)) for row in rows)):
        state: State | None = start
        for row, index in zip(rows, combo, strict=True):
            state = operator.place(state, row[index][0]) if state is not None else None
        if state is None:
            continue
        total = sum(ticks(row[index][1]) for row, index in zip(rows, combo, strict=True))
        key = (total, combo[::-1])
        if best is None or key < best:
            best = key
    assert best is not None, "the candidates fit at their minimums"
    return best[1][::-1]


tie_prone = st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0, 4.0])
any_duration = st.floats(0.01, 20.0, allow_nan=False)
duration = st.one_of(tie_prone, any_duration)


@st.composite
def options(draw: st.DrawFn, allowed: Sequence[int], max_options: int) -> tuple[Option, ...]:
    """Allowed counts with durations: Amdahl-shaped (ties likely) or arbitrary, some unknown."""
    counts = sorted(draw(st.sets(st.sampled_from(allowed), min_size=1, max_size=max_options)))
    if draw(st.integers(0, 9)) == 0:
        return tuple((count, None) for count in counts)
    if draw(st.booleans()):
        t1, serial = draw(duration), draw(st.sampled_from([0.0, 0.25, 0.5]))
        return tuple((count, t1 * (serial + (1 - serial) / count)) for count in counts)
    return tuple((count, draw(duration)) for count in counts)


@st.composite
def jobs(
    draw: st.DrawFn, key: str, allowed: Sequence[int], max_jobs: int, max_options: int
) -> list[Job]:
    count = draw(st.integers(2, max_jobs))
    return [
        Job(
            f"{key}{i}",
            key,
            draw(options(allowed, max_options)),
            submitted_at=NOW - draw(st.sampled_from([0.0, 0.5, 1.0]) | st.floats(0.0, 5.0)),
            elastic=draw(st.integers(0, 7)) > 0,
        )
        for i in range(count)
    ]


@st.composite
def running(draw: st.DrawFn, key: str, busy: int) -> list[RunningJob]:
    result: list[RunningJob] = []
    while busy > 0 and draw(st.booleans()):
        units = draw(st.integers(1, busy))
        finish = draw(st.none() | st.floats(NOW - 1.0, NOW + 8.0) | st.sampled_from([NOW + 1.0]))
        result.append(RunningJob(f"r{key}{len(result)}", key, units, finish))
        busy -= units
    return result


@st.composite
def cpu_snapshots(
    draw: st.DrawFn, max_cores: int = 8, max_jobs: int = 6, max_options: int = 3
) -> Snapshot:
    total = draw(st.integers(2, max_cores))
    free = sorted(draw(st.sets(st.integers(0, total - 1), min_size=total // 2)))
    groups = draw(st.integers(1, 2))
    pool = CpuPool("cpu", tuple(Core(core, core % groups) for core in free), total)
    allowed = [*range(1, total + 1), *range(1, total + 1), total + 1]
    waiting = draw(jobs("cpu", allowed, max_jobs, max_options))
    busy = draw(running("cpu", total - len(free)))
    return Snapshot(NOW, tuple(waiting), (pool,), tuple(busy))


@st.composite
def gpu_snapshots(draw: st.DrawFn, max_jobs: int = 6, max_options: int = 3) -> Snapshot:
    total = draw(st.sampled_from([8, 16]))
    free = sorted(draw(st.sets(st.integers(0, total - 1), min_size=total // 2)))
    pool = GpuPool("gpu", tuple(free), total)
    waiting = draw(jobs("gpu", [1, 2, 3, 4, 8], max_jobs, max_options))
    busy = draw(running("gpu", total - len(free)))
    return Snapshot(NOW, tuple(waiting), (pool,), tuple(busy))


configs = st.builds(
    SchedulerConfig,
    depth=st.integers(1, 3),
    fallback_duration=st.sampled_from([1.0, 2.5]),
    ordering=st.sampled_from([Fcfs(), ShortestFirst(max_wait=2.0)]),
)


@settings(max_examples=300, deadline=None)
@given(cpu_snapshots(), configs)
def test_cpu_decisions_match_the_naive_definition(
    snapshot: Snapshot, config: SchedulerConfig
) -> None:
    fast = decide(snapshot, config)
    assert fast == decide_reference(snapshot, config)
    assert fast == decide_reference(snapshot, config, allocate=enumerate_allocate)


@settings(max_examples=300, deadline=None)
@given(gpu_snapshots(), configs)
def test_gpu_decisions_match_the_naive_definition(
    snapshot: Snapshot, config: SchedulerConfig
) -> None:
    fast = decide(snapshot, config)
    assert fast == decide_reference(snapshot, config)
    assert fast == decide_reference(snapshot, config, allocate=enumerate_allocate)


@settings(max_examples=100, deadline=None)
@given(cpu_snapshots(max_cores=40, max_jobs=24, max_options=10), configs)
def test_larger_cpu_decisions_match_the_per_step_python_dp(
    snapshot: Snapshot, config: SchedulerConfig
) -> None:
    assert decide(snapshot, config) == decide_reference(snapshot, config)


@st.composite
def dp_rows(draw: st.DrawFn) -> tuple[int, list[tuple[Option, ...]]]:
    budget = draw(st.integers(1, 10))
    rows = draw(
        st.lists(
            st.sets(st.integers(1, 6), min_size=1, max_size=4).flatmap(
                lambda counts: st.tuples(*(st.tuples(st.just(c), duration) for c in sorted(counts)))
            ),
            min_size=1,
            max_size=5,
        )
    )
    return budget, rows


@settings(max_examples=200, deadline=None)
@given(dp_rows())
def test_every_prefix_of_the_dp_tables(case: tuple[int, list[tuple[Option, ...]]]) -> None:
    """CountSolver (column sweep) = StateSolver over counts = enumeration, prefix by prefix."""
    budget, rows = case
    operator = CpuOperator(CpuPool("cpu", tuple(Core(i) for i in range(budget)), budget))
    arrays = [option_arrays(row) for row in rows]
    count = CountSolver(budget, arrays)
    state = StateSolver((budget,), operator.place, arrays)
    plain = [[(units, float(d or 0.0)) for units, d in row] for row in rows]
    minimums = np.cumsum([row[0][0] for row in rows])
    for k in range(len(rows), 0, -1):  # in eviction order, then a fresh one at random
        if minimums[k - 1] > budget:
            continue
        expected = enumerate_allocate(operator, (budget,), plain[:k])
        assert python_dp(operator, (budget,), plain[:k]) == expected
        for solver in (count, state, CountSolver(budget, arrays)):
            found = solver.solve(k)
            assert found.options(k) == expected
            total = sum(ticks(plain[i][option][1]) for i, option in enumerate(expected))
            assert found.total == total
            for i, pick in found.picks.items():
                assert pick.units == rows[i][pick.option][0]
                assert pick.cost == ticks(plain[i][pick.option][1])


def test_the_oracle_notices_a_wrong_tie_rule() -> None:
    """Sanity check of the harness: an allocator breaking ties the other way is caught."""

    def largest_last(operator: Operator, start: State, rows: Rows) -> tuple[int, ...]:
        best = enumerate_allocate(operator, start, rows)
        total = sum(ticks(row[i][1]) for row, i in zip(rows, best, strict=True))
        combos = itertools.product(*(range(len(r)) for r in rows))
        for combo in sorted(combos, key=lambda c: c[::-1], reverse=True):
            placed: State | None = start
            for row, index in zip(rows, combo, strict=True):
                placed = operator.place(placed, row[index][0]) if placed is not None else None
            if placed is not None and total == sum(
                ticks(row[i][1]) for row, i in zip(rows, combo, strict=True)
            ):
                return combo
        return best

    jobs_ = tuple(
        Job(n, "gpu", ((1, 8.0), (2, 4.0), (4, 2.0)), submitted_at=i) for i, n in enumerate("xyz")
    )
    snapshot = Snapshot(3.0, jobs_, (GpuPool("gpu", tuple(range(8)), 8),))
    assert decide(snapshot) != decide_reference(snapshot, allocate=largest_last)
