"""The resize decisions of malleable test runs, as plain-data tables."""

from __future__ import annotations

import pytest

from tangram_celery.scheduling.malleable import (
    MalleableRun,
    ResizeConfig,
    ResizeDecision,
    ResizeInputs,
    Waiting,
    decide_resize,
    grow_gain,
)

START_1S = ResizeConfig(worker_start_s=1.0)
SHORTEST = ResizeConfig(worker_start_s=1.0, weighting="shortest")
RELATIVE = ResizeConfig(worker_start_s=1.0, weighting="relative")
EQUI = ResizeConfig(worker_start_s=1.0, weighting="equi")
MOVES = ResizeConfig(worker_start_s=1.0, move_gain=0.0)


def run(run_id: str, workers: int, work: float | None, tests: int = 100, done: int = 0,
        spent: float = 0.0, parallel: float = 1.0, most: int | None = None,
        starting: bool = False) -> MalleableRun:
    """A run whose learned single-core duration makes ``work`` core-seconds remain."""
    expected = None if work is None or not tests else work * tests / (tests - done)
    return MalleableRun(run_id, workers, tests, done, spent, expected, parallel, most, starting)


CASES = [
    ("free cores go to a long run", ResizeInputs(3, (run("a", 1, 100.0),)), START_1S,
     ResizeDecision(grow={"a": 3})),
    ("no test left for a new worker", ResizeInputs(2, (run("a", 1, 1.0, tests=10, done=9),)),
     START_1S, ResizeDecision(idle=2)),
    ("the start cost eats the gain", ResizeInputs(2, (run("a", 1, 1.5),)),
     ResizeConfig(worker_start_s=2.0), ResizeDecision(idle=2)),
    ("a run grows while it gains, then the rest stays idle",
     ResizeInputs(8, (run("a", 1, 6.0),)), START_1S, ResizeDecision(grow={"a": 5}, idle=3)),
    ("a least gain stops it earlier",
     ResizeInputs(8, (run("a", 1, 6.0),)), ResizeConfig(worker_start_s=1.0, min_gain=0.5),
     ResizeDecision(grow={"a": 2}, idle=6)),
    ("an exec action takes a core back from the run that loses least",
     ResizeInputs(0, (run("a", 3, 90.0), run("b", 2, 10.0)), (Waiting("x"),)), START_1S,
     ResizeDecision(start=("x",), shrink={"b": 1})),
    ("shortest first takes it from the longest run instead",
     ResizeInputs(0, (run("a", 3, 90.0), run("b", 2, 10.0)), (Waiting("x"),)), SHORTEST,
     ResizeDecision(start=("x",), shrink={"a": 1})),
    ("free cores are used before any is taken back",
     ResizeInputs(1, (run("a", 3, 90.0),), (Waiting("x"), Waiting("y"))), START_1S,
     ResizeDecision(start=("x", "y"), shrink={"a": 1})),
    ("a run keeps one worker, and a head that cannot start blocks the queue",
     ResizeInputs(0, (run("a", 1, 90.0),), (Waiting("x", 2), Waiting("y"))), START_1S,
     ResizeDecision()),
    ("absolute: the long run gains more seconds",
     ResizeInputs(1, (run("long", 1, 100.0), run("short", 1, 4.0))), START_1S,
     ResizeDecision(grow={"long": 1})),
    ("shortest: the short run grows first",
     ResizeInputs(1, (run("long", 1, 100.0), run("short", 1, 4.0))), SHORTEST,
     ResizeDecision(grow={"short": 1})),
    ("a run of unknown work grows only onto cores no known gain wants",
     ResizeInputs(3, (run("known", 1, 100.0, tests=2), run("new", 1, None, tests=50))),
     START_1S, ResizeDecision(grow={"known": 1, "new": 2})),
    ("a run of unknown work gives its cores back first",
     ResizeInputs(0, (run("known", 2, 100.0), run("new", 2, None)), (Waiting("x"),)), START_1S,
     ResizeDecision(start=("x",), shrink={"new": 1})),
    ("a run still collecting does not grow",
     ResizeInputs(2, (MalleableRun("a", 1, 0, 0, expected_core_s=100.0),)),
     START_1S, ResizeDecision(idle=2)),
    ("a run that gave a core back does not grow in the same decision",
     ResizeInputs(1, (run("a", 2, 100.0), run("b", 2, 100.0)), (Waiting("x", 2),)), START_1S,
     ResizeDecision(start=("x",), shrink={"a": 1})),
    ("sublinear speed-up (Amdahl p = 0.5) stops growth sooner than linear",
     ResizeInputs(8, (run("a", 1, 6.0, parallel=0.5),)),
     ResizeConfig(worker_start_s=1.0, min_gain=0.3), ResizeDecision(grow={"a": 2}, idle=6)),
    ("a run grows no further than its most workers",
     ResizeInputs(3, (run("a", 1, 100.0, most=2),)), START_1S,
     ResizeDecision(grow={"a": 1}, idle=2)),
    ("a run started in this decision grows at no start cost",
     ResizeInputs(8, (run("a", 1, 1.5, starting=True),)), ResizeConfig(worker_start_s=2.0),
     ResizeDecision(grow={"a": 8})),
    ("a reserve stays free for arrivals",
     ResizeInputs(3, (run("a", 1, 100.0),), reserve=2), START_1S,
     ResizeDecision(grow={"a": 1}, idle=2)),
    ("waiting actions may take the reserve",
     ResizeInputs(1, (run("a", 1, 100.0),), (Waiting("x"),), reserve=2), START_1S,
     ResizeDecision(start=("x",))),
    ("absolute: a wide long run saves more than a short one",
     ResizeInputs(1, (run("long", 4, 100.0), run("short", 1, 4.0))), START_1S,
     ResizeDecision(grow={"long": 1})),
    ("relative: the short run saves the larger share of its time",
     ResizeInputs(1, (run("long", 4, 100.0), run("short", 1, 4.0))), RELATIVE,
     ResizeDecision(grow={"short": 1})),
    ("relative: a core is taken from the run that loses the least share",
     ResizeInputs(0, (run("a", 3, 90.0), run("b", 2, 10.0)), (Waiting("x"),)), RELATIVE,
     ResizeDecision(start=("x",), shrink={"a": 1})),
    ("equi: the run with the fewest workers grows",
     ResizeInputs(1, (run("a", 3, 100.0), run("b", 1, 10.0))), EQUI,
     ResizeDecision(grow={"b": 1})),
    ("absolute grows the run that saves more instead",
     ResizeInputs(1, (run("a", 3, 100.0), run("b", 1, 10.0))), START_1S,
     ResizeDecision(grow={"a": 1})),
    ("equi: a core is taken from the run with the most workers",
     ResizeInputs(0, (run("a", 3, 10.0), run("b", 2, 90.0)), (Waiting("x"),)), EQUI,
     ResizeDecision(start=("x",), shrink={"a": 1})),
    ("a core moves when the taker saves more than the giver loses",
     ResizeInputs(0, (run("wide", 4, 4.0), run("long", 1, 100.0))), MOVES,
     ResizeDecision(grow={"long": 3}, shrink={"wide": 3})),
    ("an exec action starts before a test run that arrived first, when asked",
     ResizeInputs(1, (), (Waiting("t", malleable=True), Waiting("x"))),
     ResizeConfig(worker_start_s=1.0, others_first=True), ResizeDecision(start=("x",))),
    ("in arrival order otherwise",
     ResizeInputs(1, (), (Waiting("t", malleable=True), Waiting("x"))), START_1S,
     ResizeDecision(start=("t",))),
    ("without moves the cores stay",
     ResizeInputs(0, (run("wide", 4, 4.0), run("long", 1, 100.0))), START_1S,
     ResizeDecision()),
]


@pytest.mark.parametrize(("name", "inputs", "config", "expected"), CASES,
                         ids=[case[0] for case in CASES])
def test_decisions(name: str, inputs: ResizeInputs, config: ResizeConfig,
                   expected: ResizeDecision) -> None:
    assert decide_resize(inputs, config) == expected


def test_remaining_work_without_a_learned_duration_comes_from_the_work_done() -> None:
    measured = MalleableRun("a", 1, tests=10, done=5, core_s_spent=50.0)
    assert measured.remaining_core_s == pytest.approx(50.0)
    assert MalleableRun("a", 1, tests=10, done=0).remaining_core_s is None
    learned = MalleableRun("a", 2, tests=10, done=5, expected_core_s=30.0)
    assert learned.remaining_core_s == pytest.approx(15.0)
    assert learned.spare_tests == 3


def test_the_gain_counts_the_start_cost() -> None:
    a = run("a", 1, 100.0)
    assert grow_gain(a, 1, ResizeConfig(worker_start_s=0.0)) == pytest.approx(50.0)
    assert grow_gain(a, 1, START_1S) == pytest.approx(100.0 - (1.0 + 99.0 / 2))
    assert grow_gain(run("u", 1, None), 1, START_1S) is None


def test_the_gain_follows_amdahls_law() -> None:
    half = run("a", 1, 100.0, parallel=0.5)
    assert grow_gain(half, 1, ResizeConfig(worker_start_s=0.0)) == pytest.approx(25.0)
    assert half.rate(2) == pytest.approx(4 / 3)
    assert grow_gain(run("a", 2, 100.0, most=2), 2, START_1S) == 0.0


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="workers"):
        MalleableRun("a", 0, 10, 0)
    with pytest.raises(ValueError, match="core"):
        Waiting("x", 0)
    with pytest.raises(ValueError, match="weighting"):
        ResizeConfig(worker_start_s=1.0, weighting="fair")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="parallel"):
        MalleableRun("a", 1, 10, 0, parallel=1.5)
    with pytest.raises(ValueError, match="move_gain"):
        ResizeConfig(worker_start_s=1.0, move_gain=-1.0)
