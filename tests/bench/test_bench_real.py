"""The real-stack mode: a tiny AI-coding batch through Redis, Celery and a node worker."""

from __future__ import annotations

import shutil

import pytest

from tangram_bench.elastic import real_workload, run_real, scheduler_for
from tangram_bench.elastic.actions import action_for
from tangram_bench.sim.invariants import incomplete, parts_mismatch
from tangram_celery.settings import Settings

CORES = 4


@pytest.mark.slow
def test_real_stack_runs_each_system(settings: Settings) -> None:
    workload = real_workload(3, 2, CORES)
    try:
        runs = {name: run_real(workload, name, CORES, {"batch": 3, "cores": CORES},
                               settings=settings)
                for name in ("tangram", "tangram:ersa", "fixed-dop-2", "fcfs-min", "celery")}
    finally:
        shutil.rmtree(settings.sandbox.root, ignore_errors=True)
    for result in runs.values():
        assert incomplete(workload, result) == []
        assert parts_mismatch(result) == []
        assert all(r.total >= r.exec > 0 and r.queue >= 0 for r in result.records)
    stock = runs.pop("celery")
    assert {(r.node, r.units, r.sched_s) for r in stock.records} == {("stock", 1, 0.0)}
    assert stock.decide_calls == 0, "no tangram scheduler in the stock Celery path"
    assert max(r.started for r in stock.records) > 0
    for result in runs.values():
        assert incomplete(workload, result) == []
        assert parts_mismatch(result) == []
        assert result.makespan > 0
        assert all(r.total >= r.exec > 0 for r in result.records)
        assert result.decide_calls >= 1 and result.decide_s > 0, "the node reports its policy"
        assert sum(r.sched_s > 0 for r in result.records) >= 1
        assert all(r.sched_s <= r.queue + 1e-3 for r in result.records), \
            "a decision is part of the queue time"
    tests = {name: {r.units for r in run.records if r.kind == "test_run"}
             for name, run in runs.items()}
    assert tests["fixed-dop-2"] == {2}
    assert tests["fcfs-min"] == {1}
    assert tests["tangram"] <= set(range(1, CORES + 1))
    assert tests["tangram:ersa"] <= set(range(1, CORES + 1))
    assert {r.units for r in runs["fcfs-min"].records} == {1}


def test_real_systems_map_to_worker_schedulers() -> None:
    assert scheduler_for("tangram") == Settings.from_env({}).node.scheduler == "robust"
    assert scheduler_for("tangram:ersa") == scheduler_for("fixed-dop-4") == "elastic"
    assert scheduler_for("fcfs-min") == "fcfs-min"
    with pytest.raises(ValueError, match=r"tangram:\{robust,ersa\}"):
        scheduler_for("tangram:nope")
    with pytest.raises(ValueError, match="not 'celery'"):
        scheduler_for("celery")


def test_no_real_stack_action_declares_its_duration() -> None:
    workload = real_workload(4, 1, CORES)
    specs = [spec for t in workload.trajectories for spec in t.actions]
    assert {spec.kind for spec in specs} == {"exec", "test_run"}
    for system in ("tangram", "fixed-dop-2", "fcfs-min"):
        actions = [action_for(spec, "t", system, CORES) for spec in specs]
        assert all(a.t1 is None for a in actions), system
        assert {a.signature for a in actions if a.kind == "exec"} == {"emulated-exec"}
