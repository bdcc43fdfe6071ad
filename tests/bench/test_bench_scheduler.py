"""``python -m tangram_bench.scheduler``: warm and cold rows side by side, and verdicts."""

from __future__ import annotations

from tangram_bench.scheduler import Row, decision_rows, verdicts


def test_every_policy_and_workload_has_a_warm_and_a_cold_row() -> None:
    rows = decision_rows(2)
    cases = [row.case for row in rows]
    assert len(cases) == 8
    for policy in ("decide", "decide_robust"):
        for label in ("warm", "cold"):
            assert sum(c.startswith(f"{policy},") and c.endswith(f", {label}")
                       for c in cases) == 2
    assert all(row.n == row.m == 256 and row.fast_ms > 0 for row in rows)


def test_verdicts_compare_each_median_with_the_goal() -> None:
    rows = [Row("decide, x, warm", 256, 256, 32, 8, 1.5, 2.0, 1.4),
            Row("decide, x, cold", 256, 256, 32, 8, 3.5, 4.0, 3.0),
            Row("vs naive, CPU", 64, 64, 32, 8, 0.5, 0.6, 0.5)]
    assert [line.rsplit(" ", 2)[-2:] for line in verdicts(rows)] == [["ms", "met"],
                                                                     ["NOT", "met"]]
