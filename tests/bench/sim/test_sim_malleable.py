"""Malleable test runs in the simulator: a straggler widens when cores free up and gives one
back at once when an exec action arrives; every weighting passes the invariants."""

from __future__ import annotations

import pytest

from tangram_bench.plan import Point, workload_at
from tangram_bench.sim.cluster import Cluster
from tangram_bench.sim.costs import SCHEDULING_ONLY
from tangram_bench.sim.durations import DurationMode
from tangram_bench.sim.engine import Engine
from tangram_bench.sim.invariants import violations
from tangram_bench.sim.malleable import MalleableKnobs, MalleableNodes
from tangram_bench.sim.record import RunResult
from tangram_bench.sim.systems import backends, simulate, system
from tangram_bench.workloads import ActionSpec, Trajectory, Workload
from tangram_celery.scheduling.malleable import WEIGHTINGS

NODE = Cluster(cpu_nodes=1, cores_per_node=4, numa_per_node=1)
KNOBS = MalleableKnobs(worker_start_s=0.5, takeback_s=0.002)


def straggler() -> Workload:
    """A 16 s perfectly parallel test run and three 2 s exec actions at t = 0 on a 4-core
    node, then a 1 s exec action at t = 3."""
    return Workload("straggler", (
        Trajectory("a", (ActionSpec("test_run", 16.0, 0.0, (1, 2, 3, 4), 1.0),)),
        *(Trajectory(name, (ActionSpec("exec", 2.0, 0.0),)) for name in "bcd"),
        Trajectory("e", (ActionSpec("exec", 1.0, 3.0),)),
    ))


def test_a_straggler_grows_when_cores_free_up_and_shrinks_for_an_exec_action() -> None:
    workload = straggler()
    built = backends(workload, system("tangram:malleable"), NODE, SCHEDULING_ONLY, 0,
                     DurationMode("oracle"), KNOBS)
    result = RunResult("tangram:malleable", workload.name, {})
    Engine(workload, built).run(result)
    assert violations(workload, result) == []
    records = {r.trajectory: r for r in result.records}
    assert records["e"].queue == pytest.approx(0.002)
    assert records["e"].finished == pytest.approx(4.002)
    # 2 s on one core, 0.5 s more while three workers start, 0.5 s on four, 1.502 s on
    # three (1.002 s while the exec action runs, 0.5 s while the fourth restarts), then four.
    left = 16.0 - 2.5 - 0.5 * 4 - 1.502 * 3
    assert records["a"].finished == pytest.approx(4.502 + left / 4)
    core3 = sorted((a.start, a.end) for a in result.allocations if 3 in a.units)
    assert core3 == [(0.0, 2.0), (2.0, pytest.approx(3.002)),
                     (pytest.approx(3.002), pytest.approx(4.002)),
                     (pytest.approx(4.002), pytest.approx(records["a"].finished))]
    cpu = built["cpu"]
    assert isinstance(cpu, MalleableNodes) and cpu.resizes == 3


def test_a_core_given_at_the_start_works_at_once() -> None:
    workload = Workload("alone", (
        Trajectory("a", (ActionSpec("test_run", 8.0, 0.0, (1, 2, 3, 4), 1.0),)),))
    result = simulate(workload, "tangram:malleable", NODE, SCHEDULING_ONLY,
                      durations=DurationMode("oracle"), knobs=KNOBS)
    assert result.records[0].units == 4 and result.records[0].exec == pytest.approx(2.0)


@pytest.mark.parametrize("weighting", WEIGHTINGS)
def test_every_weighting_runs_the_coding_workload_with_learned_durations(
        weighting: str) -> None:
    point = Point(batch=24, cores=64)
    workload = workload_at("coding", point, 1)
    result = simulate(workload, f"tangram:malleable:{weighting}",
                      point.cluster(cores_per_node=32), SCHEDULING_ONLY, seed=1)
    assert violations(workload, result) == []
    assert max(r.units for r in result.records if r.kind == "test_run") > 1


def test_an_unknown_weighting_is_refused() -> None:
    with pytest.raises(ValueError, match="weighting"):
        system("tangram:malleable:fair")
