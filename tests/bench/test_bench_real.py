"""The real-stack mode: a tiny AI-coding batch through Redis, Celery and a node worker."""

from __future__ import annotations

import shutil

import pytest

from tangram_bench.elastic import real_workload, run_real, scheduler_for
from tangram_bench.sim.invariants import incomplete, parts_mismatch
from tangram_celery.settings import Settings

CORES = 4


@pytest.mark.slow
def test_real_stack_runs_each_system(settings: Settings) -> None:
    workload = real_workload(3, 2, CORES)
    try:
        runs = {name: run_real(workload, name, CORES, {"batch": 3, "cores": CORES},
                               settings=settings)
                for name in ("tangram", "tangram:ersa", "fixed-dop-2", "celery")}
    finally:
        shutil.rmtree(settings.sandbox.root, ignore_errors=True)
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
    assert tests["celery"] == {1}
    assert tests["tangram"] <= set(range(1, CORES + 1))
    assert tests["tangram:ersa"] <= set(range(1, CORES + 1))
    assert {r.units for r in runs["celery"].records} == {1}


def test_real_systems_map_to_worker_schedulers() -> None:
    assert scheduler_for("tangram") == Settings.from_env({}).node.scheduler == "robust"
    assert scheduler_for("tangram:ersa") == scheduler_for("fixed-dop-4") == "elastic"
    assert scheduler_for("celery") == "fcfs-min"
    with pytest.raises(ValueError, match=r"tangram:\{robust,ersa\}"):
        scheduler_for("tangram:nope")
