"""The node's view of its malleable runs, as plain data: what the resize decision sees of a run
from its control socket's answer, the idle cores it gives back, and the loan book's record of a
run whose cores change."""

from __future__ import annotations

from typing import Any

import pytest

from tangram_celery.pools.admission import Request
from tangram_celery.pools.cpu_pool.loans import CoreLoans
from tangram_celery.pools.cpu_pool.resizing import Tracked, idle_cores, resize_inputs, run_view
from tangram_celery.scheduling.lending import LoanConfig
from tangram_celery.scheduling.malleable import MalleableRun, Waiting


def tracked(units: list[int], since: float = 0.0, core_s: float = 0.0) -> Tracked:
    return Tracked("run", "t", units, ".sock", 60.0, since, core_s)


VIEWS = [
    ("collecting: no tests yet", [0], {"tests": 0, "done": 0, "queued": None}, 0, 0),
    ("one worker holding an id ahead", [0], {"tests": 10, "done": 2, "queued": 6}, 10, 3),
    ("queue drained: held ids count as done", [0, 1],
     {"tests": 7, "done": 5, "queued": 0}, 7, 5),
    ("nothing queued, one worker", [0], {"tests": 7, "done": 5, "queued": 0}, 7, 6),
    ("no queue figure: done as told", [0], {"tests": 4, "done": 1}, 4, 1),
]


@pytest.mark.parametrize(("name", "units", "status", "tests", "done"), VIEWS,
                         ids=[v[0] for v in VIEWS])
def test_the_decision_sees_a_run_with_only_its_queued_ids_to_spare(
        name: str, units: list[int], status: dict[str, Any], tests: int, done: int) -> None:
    view = run_view(tracked(units), status, 0.0)
    assert (view.workers, view.tests, view.done) == (len(units), tests, done)
    if status.get("queued") is not None:
        assert view.spare_tests == status["queued"]


def test_core_seconds_count_every_change_of_cores() -> None:
    run = tracked([0], since=10.0)
    run.changed([0, 1], 14.0)
    run.changed([0], 15.0)
    assert run.held_core_s(17.0) == pytest.approx(4 + 2 + 2)
    assert run.resized
    assert run_view(run, {"tests": 1, "done": 0}, 17.0).core_s_spent == pytest.approx(8.0)


IDLE = [
    ("every worker takes tests", [0, 1], {"active": 2}, 0),
    ("one drained", [0, 1, 2], {"active": 2}, 1),
    ("all drained: one core kept", [0, 1, 2], {"active": 0}, 2),
    ("no answer", [0, 1], {}, 0),
]


@pytest.mark.parametrize(("name", "units", "status", "idle"), IDLE, ids=[c[0] for c in IDLE])
def test_idle_cores(name: str, units: list[int], status: dict[str, Any], idle: int) -> None:
    assert idle_cores(tracked(units), status) == idle


def test_the_waiting_actions_enter_at_their_minimum_in_arrival_order() -> None:
    waiting = [Request("a", ((2, 1.0), (4, 0.5)), 0.0), Request("b", ((1, None),), 1.0)]
    run = MalleableRun("run", 2, 10, 3)
    inputs = resize_inputs(1, [run], waiting)
    assert inputs.free_cores == 1 and inputs.runs == (run,)
    assert inputs.waiting == (Waiting("a", 2), Waiting("b", 1))


def test_the_loan_book_follows_a_run_whose_cores_change() -> None:
    loans = CoreLoans(LoanConfig(), None, lambda units: tuple(sorted({10 + u for u in units})))
    loans.hold("run", "t", Request("run", ((1, 5.0),), 0.0), (0,), False)
    assert loans.resized("run", (0, 3))
    assert loans.held["run"].units == (0, 3) and loans.held["run"].pinned == (10, 13)
    assert not loans.resized("nobody", (1,))


def test_a_run_that_refused_to_grow_is_not_offered_cores() -> None:
    run = tracked([0])
    run.grows = False
    view = run_view(run, {"tests": 10, "done": 2, "queued": 6}, 0.0)
    assert view.spare_tests == 0 and view.done == 9


RESIZED = [
    # name, command, payload extras, cpu, learned single-core seconds, resized
    ("elastic pytest, never seen", "python3 -m pytest -q tests", {}, (1, 4), None, True),
    ("elastic pytest, long enough", "pytest tests", {}, (1, 4), 2.0, True),
    ("elastic pytest, too short for a second worker", "pytest tests", {}, (1, 4), 1.5, False),
    ("asked, though short", "pytest tests", {"malleable": True}, (1, 4), 0.1, True),
    ("opted out", "pytest tests", {"malleable": False}, (1, 4), None, False),
    ("rigid cores", "pytest tests", {}, 2, None, False),
    ("rigid but asked", "pytest tests", {"malleable": True}, 2, None, True),
    ("not pytest", "python3 solve.py", {}, (1, 4), None, False),
    ("not pytest, asked", "python3 solve.py", {"malleable": True}, (1, 4), None, False),
    ("files to fetch", "pytest tests", {"fetch": ["out.txt"]}, (1, 4), None, False),
]


@pytest.mark.parametrize(("name", "cmd", "extra", "cpu", "single", "expected"), RESIZED,
                         ids=[r[0] for r in RESIZED])
def test_which_actions_a_resizing_node_makes_malleable(
        name: str, cmd: str, extra: dict[str, Any], cpu: Any, single: float | None,
        expected: bool) -> None:
    from tangram_celery.client import test_run_action
    from tangram_celery.pools.cpu_pool.resizing import resized_run
    from tangram_celery.scheduling.malleable import node_config

    action = test_run_action("t", cmd, cpu=cpu, payload=extra)
    assert resized_run(action, single, node_config(1.0, "equi")) is expected


def test_steps_are_never_resized() -> None:
    from tangram_celery.action import parse_action
    from tangram_celery.pools.cpu_pool.resizing import resized_run
    from tangram_celery.scheduling.malleable import node_config

    action = parse_action({"id": "a", "trajectory_id": "t", "kind": "test_run",
                           "cost": {"cpu": [1, 4]},
                           "payload": {"steps": [{"cmd": "pytest tests"}]}})
    assert not resized_run(action, None, node_config(1.0, "equi"))
