"""Core loans in the simulator: a short action that would queue runs at once on a lent core,
and the lender pays for it in time (and, if it ends first, in idle cores)."""

from __future__ import annotations

import pytest

from tangram_bench.plan import Point, workload_at
from tangram_bench.sim.cluster import Cluster
from tangram_bench.sim.costs import SCHEDULING_ONLY
from tangram_bench.sim.durations import DurationMode
from tangram_bench.sim.engine import Engine
from tangram_bench.sim.invariants import violations
from tangram_bench.sim.nodes import CpuNodes
from tangram_bench.sim.record import ActionRecord, RunResult
from tangram_bench.sim.systems import backends, simulate, system
from tangram_bench.workloads import ActionSpec, Trajectory, Workload
from tangram_celery.scheduling.lending import lender_speed

NODE = Cluster(cpu_nodes=1, cores_per_node=4, numa_per_node=1)


def run_and_exec(exec_s: float) -> Workload:
    """A test run on an idle 4-core node (it gets all 4 cores: 8 s of perfectly parallel work,
    2 s), and an exec action of `exec_s` arriving at t = 0.5 from another trajectory."""
    return Workload("loans", (
        Trajectory("a", (ActionSpec("test_run", 8.0, 0.0, (1, 2, 3, 4), 1.0),)),
        Trajectory("b", (ActionSpec("exec", exec_s, 0.5),)),
    ))


def run(workload: Workload, name: str) -> tuple[RunResult, CpuNodes]:
    """Run with exact durations: these cases time the loans to the tick."""
    built = backends(workload, system(name), NODE, SCHEDULING_ONLY, 0, DurationMode("oracle"))
    result = RunResult(name, workload.name, {})
    Engine(workload, built).run(result)
    assert violations(workload, result) == []
    cpu = built["cpu"]
    assert isinstance(cpu, CpuNodes)
    return result, cpu


def by_kind(result: RunResult) -> dict[str, ActionRecord]:
    return {record.kind: record for record in result.records}


def test_the_exec_action_borrows_a_core_and_the_lender_runs_slower_meanwhile() -> None:
    result, cpu = run(run_and_exec(0.4), "tangram")
    records = by_kind(result)
    assert cpu.loans == 1
    assert records["exec"].queue == 0.0 and records["exec"].exec == pytest.approx(0.4)
    assert records["exec"].started == pytest.approx(0.5)
    assert records["test_run"].units == 4
    lost = 0.4 * (1 - lender_speed(4, 1))
    assert lost == pytest.approx(0.1)
    assert records["test_run"].exec == pytest.approx(2.0 + lost)
    held = sorted((a.start, a.end) for a in result.allocations if 3 in a.units)
    assert held == [(0.0, 0.5), (0.5, pytest.approx(0.9)), (pytest.approx(0.9),
                                                              pytest.approx(2.1))]
    assert records["exec"].held == 0.0
    assert result.reserved == pytest.approx(4 * 2.1)


def test_without_loans_the_exec_action_waits_for_the_whole_test_run() -> None:
    result, cpu = run(run_and_exec(0.4), "tangram:robust-no-loans")
    records = by_kind(result)
    assert cpu.loans == 0
    assert records["exec"].queue == pytest.approx(1.5)
    assert records["test_run"].exec == pytest.approx(2.0)


def test_a_lender_that_ends_first_holds_its_cores_until_the_loan_ends() -> None:
    """A 3 s exec borrows at t = 0.5: the test run has 1.5 s of work left, done at 3/4 speed
    by t = 2.5; its cores stay held (idle) until the exec ends at t = 3.5."""
    result, cpu = run(run_and_exec(3.0), "tangram")
    records = by_kind(result)
    assert records["exec"].queue == 0.0 and records["exec"].finished == pytest.approx(3.5)
    assert records["test_run"].finished == pytest.approx(2.5)
    assert cpu.held_after == pytest.approx(4 * 1.0)
    assert result.reserved == pytest.approx(4 * 2.5 + 4 * 1.0)
    assert max(a.end for a in result.allocations) == pytest.approx(3.5)


def test_baselines_never_lend() -> None:
    """The paper's allocator and fixed DoP 4 also give the test run all 4 cores, and the exec
    action waits; plain Celery gives it one core, so the exec action finds a free one."""
    for name in ("tangram:ersa", "fixed-dop-4", "celery"):
        result, cpu = run(run_and_exec(0.4), name)
        assert cpu.loans == 0, name
        assert (by_kind(result)["exec"].queue > 0) == (name != "celery"), name


def test_at_a_quarter_of_paper_scale_no_exec_action_queues() -> None:
    """Batch 320 on 320 cores (nodes of 64): with loans, every exec action starts on arrival,
    as in its own pod; without, some queue."""
    point = Point(batch=320, cores=320)
    workload = workload_at("coding", point, 1)
    cluster = point.cluster(cores_per_node=64)
    loans = simulate(workload, "tangram", cluster, SCHEDULING_ONLY, seed=1)
    assert violations(workload, loans) == []
    assert max(r.queue for r in loans.records if r.kind == "exec") == 0.0


def test_the_loan_ends_when_the_policy_starts_the_borrower_on_cores_of_its_own() -> None:
    """8 cores: test runs a (2 s) and b (1 s) on 4 each; a 3 s exec arrives at t = 0.5 and
    borrows from a (b ends sooner: it would hold more cores idle). Its job stays queued; at
    t = 1 b ends, the policy starts the exec on one of b's cores, it moves there and a has its
    core back: a ran at 3/4 speed for 0.5 s only."""
    every = (1, 2, 3, 4)
    workload = Workload("own", (
        Trajectory("a", (ActionSpec("test_run", 8.0, 0.0, every, 1.0),)),
        Trajectory("b", (ActionSpec("test_run", 4.0, 0.0, every, 1.0),)),
        Trajectory("c", (ActionSpec("exec", 3.0, 0.5),)),
    ))
    node = Cluster(cpu_nodes=1, cores_per_node=8, numa_per_node=1)
    built = backends(workload, system("tangram"), node, SCHEDULING_ONLY, 0,
                     DurationMode("oracle"))
    result = RunResult("tangram", workload.name, {})
    Engine(workload, built).run(result)
    assert violations(workload, result) == []
    cpu = built["cpu"]
    assert isinstance(cpu, CpuNodes) and cpu.loans == 1
    assert cpu.loan_s == pytest.approx(0.5)
    records = {record.trajectory: record for record in result.records}
    assert [records[t].units for t in "abc"] == [4, 4, 1]
    assert records["c"].queue == 0.0 and records["c"].finished == pytest.approx(3.5)
    assert records["a"].finished == pytest.approx(2.0 + 0.5 * (1 - lender_speed(4, 1)))
    assert records["c"].held == pytest.approx(2.5), "its own core from t = 1"
    own = [a for a in result.allocations if a.start == pytest.approx(1.0) and len(a.units) == 1
           and a.end == pytest.approx(3.5)]
    assert len(own) == 1 and cpu.held_after == 0.0
