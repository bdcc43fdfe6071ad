"""The trace of measured real suites: each test run is a suite's one-core time and the
parallel fraction its 2-core speed-up gives; it round-trips through the trace format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tangram_bench.workloads.suites import grow_cost, main, parallel_of, suites_workload
from tangram_bench.workloads.trace import read_trace

ROWS = [
    {"suite": "toolz-1.0.0", "plain_1core_s": 2.0, "speedup_2core": 1.6,
     "worker_start_s": 0.6},
    {"suite": "cachetools-5.5.0", "plain_1core_s": 1.3, "speedup_2core": 0.9,
     "worker_start_s": 0.5},
    {"suite": "broken", "plain_1core_s": "-", "speedup_2core": "-", "worker_start_s": "-"},
]


@pytest.mark.parametrize(("speedup", "parallel"), [(1.0, 0.0), (2.0, 1.0), (1.6, 0.75),
                                                    (0.9, 0.0), (2.5, 1.0)])
def test_the_parallel_fraction_of_a_2_core_speedup(speedup: float, parallel: float) -> None:
    assert parallel_of(speedup) == pytest.approx(parallel)


def test_each_group_runs_one_measured_suite(tmp_path: Path) -> None:
    workload = suites_workload(ROWS, batch=4, group=2, max_units=4)
    tests = [t.actions[-1] for t in workload.trajectories]
    assert [t.signature for t in tests] == ["suites-toolz-1.0.0"] * 2 + [
        "suites-cachetools-5.5.0"] * 2
    assert tests[0].t1 == 2.0 and tests[0].parallel == 0.75 and tests[0].units == (1, 2, 3, 4)
    assert tests[2].units == (1,) and tests[2].parallel == 0.0
    assert grow_cost(ROWS) == pytest.approx(0.55)
    measured = tmp_path / "m.json"
    measured.write_text(json.dumps({"rows": ROWS}))
    out = tmp_path / "t.jsonl"
    assert main([str(measured), "--batch", "4", "--group", "2", "--max-units", "4",
                 "--out", str(out)]) == 0
    assert read_trace(out).trajectories == workload.trajectories


def test_no_measured_suite_is_refused() -> None:
    with pytest.raises(ValueError, match="measured suite"):
        suites_workload(ROWS[2:], batch=4)
