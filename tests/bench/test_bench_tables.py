"""The report's tables over several seeds: means, ranges, per-seed ratios, the best fixed DoP."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tangram_bench.report import cost_lines
from tangram_bench.summary import Summary
from tangram_bench.tables import (
    comparison_table,
    headline_table,
    ordered_presets,
    span,
    spread,
    sweep_range,
    sweep_table,
)


def run(system: str, seed: int, external: float, step: float, batch: int = 8,
        costs: str = "sched") -> Summary:
    return Summary(system=system, costs=costs, point={"batch": batch}, kinds=(),
                   external=external, trajectory=external, makespan=step, step=step,
                   reserved=0.0, used=0.0, decide_calls=0, decide_ms=0.0, sched_share=0.0,
                   seed=seed)


RUNS = [run("tangram", 1, 10.0, 100.0), run("tangram", 2, 20.0, 100.0),
        run("fixed-dop-4", 1, 12.0, 150.0), run("fixed-dop-4", 2, 30.0, 150.0),
        run("fixed-dop-8", 1, 11.0, 120.0), run("fixed-dop-8", 2, 40.0, 130.0)]


def test_spread_gives_the_mean_and_the_range_of_several_values() -> None:
    assert spread([1.0, 2.0, 6.0]) == "3.00 (1.00-6.00)"
    assert spread([1.5], times=True) == "1.50x"
    assert spread([1.2, 1.4, float("nan")], times=True) == "1.30x (1.20-1.40)"
    assert spread([]) == "n/a"


def test_headline_ratios_are_the_mean_of_each_seeds_ratio() -> None:
    lines = headline_table(RUNS, ["sched"], {"sched": "alone"})
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line.split("|")[3].strip()
            for line in lines[2:]}
    assert rows[("fixed-dop-4", "external time per trajectory")] == "1.35x (1.20-1.50)"
    assert rows[("fixed-dop-8", "makespan / step time")] == "1.25x (1.20-1.30)"
    assert rows[("best fixed DoP", "external time per trajectory")] == (
        "1.35x (1.20-1.50), fixed-dop-4")  # mean 21 s against fixed-dop-8's 25.5 s
    assert rows[("best fixed DoP", "makespan / step time")] == "1.25x (1.20-1.30), fixed-dop-8"


def test_comparison_and_sweep_tables_give_the_range_over_seeds() -> None:
    table = "\n".join(comparison_table(RUNS))
    assert "| tangram | sched | 15.00 (10.00-20.00) | 100.00 (100.00-100.00) |" in table
    sweep = sweep_table([*RUNS, run("tangram", 1, 5.0, 50.0, batch=4),
                         run("fixed-dop-4", 1, 10.0, 50.0, batch=4)], "batch", "sched")
    assert sweep[0] == "| batch | tangram | fixed-dop-4 | fixed-dop-8 | best fixed DoP |"
    assert sweep[2] == "| 4 | 5.00 | 10.00 (2.00x) | n/a | 2.00x, fixed-dop-4 |"
    assert sweep[3].startswith("| 8 | 15.00 (10.00-20.00) | 21.00 (12.00-30.00) (1.35x ")


def test_each_single_cost_preset_names_its_flag_and_the_flag_its_source() -> None:
    text = "\n".join(cost_lines(["sched", "pods256", "api"]))
    assert "| pod cap 256 per node alone | max_pods_per_node 256 |" in text
    assert "| API rate 5 QPS alone | api_qps 5.0, api_burst 10 |" in text
    assert "| api_qps | raised in the client" in text and "| client-side rate limit" in text
    assert "dispatch_s" not in text


def test_the_pod_cap_row_shows_the_default_and_what_an_operator_would_set() -> None:
    lines = cost_lines(["sched", "cp"])
    assert "| flag | what an operator would set | source |" in lines
    [row] = [line for line in lines if line.startswith("| max_pods_per_node |")]
    operator, source = row.split(" | ")[1:3]
    assert operator.startswith("256 on a 256-core node") and "default 110" in operator
    assert "kubelet's default maxPods is 110" in source


def test_scheduling_effects_alone_is_the_first_ratio_column_whatever_the_order_given() -> None:
    runs = [*RUNS, *(replace(r, costs="cp") for r in RUNS)]
    header = headline_table(runs, ["cp", "sched"], {"sched": "alone", "cp": "cp"})[0]
    assert header == "| baseline | metric | ratio: alone | ratio: cp |"
    assert ordered_presets(["pods110", "cp", "sched"]) == ["sched", "pods110", "cp"]


SWEPT = [*RUNS, run("tangram", 1, 5.0, 50.0, batch=4), run("fixed-dop-4", 1, 10.0, 50.0, batch=4),
         run("tangram", 1, 10.0, 50.0, batch=16), run("fixed-dop-4", 1, 9.0, 50.0, batch=16)]
"""fixed-dop-4 / tangram: 2.00x at batch 4, 1.35x (seeds 1.20, 1.50) at 8, 0.90x at 16."""


@pytest.mark.parametrize(("baseline", "found", "written"), [
    ("fixed-dop-4", (0.9, 2.0), "0.90x-2.00x"),
    ("fixed-dop-8", None, "n/a"),
    ("celery", None, "n/a"),
])
def test_the_range_over_a_sweeps_points_is_of_each_points_mean_ratio(
        baseline: str, found: tuple[float, float] | None, written: str) -> None:
    got = sweep_range(SWEPT, "batch", baseline, "sched", lambda s: s.external)
    assert got == (pytest.approx(found) if found else None)
    assert span(got) == written


def test_a_sweep_headline_has_a_column_of_the_range_over_its_points() -> None:
    at_base = [s for s in SWEPT if s.point["batch"] == 8]
    lines = headline_table(at_base, ["sched"], {"sched": "alone"}, ("batch", SWEPT))
    assert lines[0] == "| baseline | metric | ratio: alone | over the batch points: alone |"
    row = next(line for line in lines if line.startswith("| fixed-dop-4 | external time"))
    assert row == "| fixed-dop-4 | external time per trajectory | 1.35x (1.20-1.50) | 0.90x-2.00x |"
    assert cost_lines(["sched"]) == []


def test_the_parallel_sweep_table_names_its_base_point_the_default_mix() -> None:
    mixed = [replace(r, point={"batch": 8}) for r in RUNS[:4]]
    fixed = [replace(r, point={"batch": 8, "parallel": 0.5}) for r in RUNS[:4]]
    table = sweep_table([*fixed, *mixed], "parallel", "sched")
    assert [line.split(" | ")[0] for line in table[2:]] == ["| default mix", "| 0.5"]


def test_a_best_baseline_row_per_metric_names_the_lowest_ratio_among_all_baselines() -> None:
    runs = [*RUNS, run("static", 1, 9.0, 300.0), run("static", 2, 30.0, 300.0)]
    lines = headline_table(runs, ["sched"], {"sched": "alone"})
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line.split("|")[3].strip()
            for line in lines[2:]}
    assert rows[("best baseline", "external time per trajectory")] == (
        "1.20x (0.90-1.50), static")  # static 1.20x, fixed-dop-4 1.35x, fixed-dop-8 1.55x
    assert rows[("best baseline", "makespan / step time")] == "1.25x (1.20-1.30), fixed-dop-8"
    alone = headline_table([r for r in RUNS if r.system != "fixed-dop-8"], ["sched"], {})
    assert not any("best baseline" in line for line in alone), "one baseline: no such row"
