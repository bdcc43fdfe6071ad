"""``tangram bench`` end to end in simulation mode: its files, tables and plots."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tangram_bench.suite import main
from tangram_bench.workloads import coding, write_trace


def test_single_point_writes_every_output(tmp_path: Path) -> None:
    code = main(["coding", "--batch", "8", "--cores", "256", "--systems",
                 "tangram,static,celery", "--out", str(tmp_path)])
    assert code == 0
    folder = tmp_path / "bench"
    for name in ("coding-sim.md", "coding-sim.json", "coding-sim.actions.json",
                 "coding-sim-cdf.png", "coding-sim-breakdown.png"):
        assert (folder / name).stat().st_size > 0
    actions = json.loads((folder / "coding-sim.actions.json").read_text())
    assert len(actions["runs"]) == 6  # 3 systems x 2 cost presets
    total = coding(8, 1).action_count()
    fields = actions["fields"]
    for run in actions["runs"]:
        assert len(run["actions"]) == total
        for row in run["actions"]:
            item = dict(zip(fields, row, strict=True))
            assert abs(item["queue"] + item["exec"] + item["overhead"] - item["total"]) < 1e-5
    report = (tmp_path / "results.md").read_text()
    assert report.startswith("# Benchmark results")
    assert "tangram bench coding --batch 8" in report
    assert "| static | external time per trajectory |" in report
    assert "max_pods_per_node" in report


def test_sweep_table_and_plot(tmp_path: Path) -> None:
    code = main(["coding", "--sweep", "batch", "--points", "4,8", "--batch", "8",
                 "--cores", "256", "--systems", "tangram,fixed-dop-4", "--costs", "sched",
                 "--out", str(tmp_path)])
    assert code == 0
    assert (tmp_path / "bench" / "coding-sim-batch-sweep.png").stat().st_size > 0
    text = (tmp_path / "bench" / "coding-sim-batch.md").read_text()
    assert "### Sweep over batch" in text and "| 4 |" in text and "| 8 |" in text


def test_seeds_give_every_figure_as_a_mean_and_range(tmp_path: Path) -> None:
    code = main(["coding", "--batch", "8", "--cores", "256", "--systems", "tangram,fixed-dop-4",
                 "--costs", "sched,pods256", "--seeds", "1,2", "--out", str(tmp_path)])
    assert code == 0
    summaries = json.loads((tmp_path / "bench" / "coding-sim.json").read_text())
    assert sorted({(s["system"], s["costs"], s["seed"]) for s in summaries}) == sorted(
        (system, costs, seed) for system in ("tangram", "fixed-dop-4")
        for costs in ("sched", "pods256") for seed in (1, 2))
    text = (tmp_path / "bench" / "coding-sim.md").read_text()
    assert "seeds 1, 2 (each figure: the mean over them" in text
    assert "durations told to the policies: `learned`" in text
    assert "| pod cap 256 per node alone | max_pods_per_node 256 |" in text
    row = next(line for line in text.splitlines()
               if line.startswith("| fixed-dop-4 | external time per trajectory |"))
    assert re.fullmatch(r"(\| [^|]+ ){2}(\| \d+\.\d\dx \(\d+\.\d\d-\d+\.\d\d\) ){2}\|", row)
    assert "| best fixed DoP | makespan / step time |" in text
    assert "#### tangram, scheduling effects alone, seed 1" in text
    assert "#### tangram, scheduling effects alone, seed 2" not in text
    assert "(4 of them reuse the run of another preset" in text  # pooled: no pod cap
    again = [s for s in summaries if s["system"] == "tangram" and s["seed"] == 1]
    assert again[0]["external"] == again[1]["external"]


def test_gpu_sweep_skips_what_cannot_fit(tmp_path: Path) -> None:
    code = main(["mopd", "--sweep", "gpus", "--points", "8,24", "--gpus", "24",
                 "--batch", "8", "--systems", "tangram,static", "--costs", "sched",
                 "--out", str(tmp_path)])
    assert code == 0
    summaries = json.loads((tmp_path / "bench" / "mopd-sim-gpus.json").read_text())
    assert {(s["system"], s["point"]["gpus"]) for s in summaries} == {
        ("tangram", 8), ("tangram", 24), ("static", 24)}


def test_trace_replay_and_bad_arguments(tmp_path: Path) -> None:
    trace = tmp_path / "mine.jsonl"
    write_trace(trace, coding(4, 9))
    assert main(["trace", "--trace", str(trace), "--cores", "256", "--systems", "tangram",
                 "--costs", "cp", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "bench" / "trace-sim.md").exists()
    assert main(["trace", "--out", str(tmp_path)]) == 2
    assert main(["coding", "--costs", "nope", "--out", str(tmp_path)]) == 2
    assert main(["deepsearch", "--mode", "real", "--out", str(tmp_path)]) == 2
    assert main(["mopd", "--mode", "real", "--time-scale", "0", "--out", str(tmp_path)]) == 2
    assert main(["mopd", "--mode", "real", "--gpus", "12", "--out", str(tmp_path)]) == 2
    assert main(["coding", "--time-scale", "0.5", "--out", str(tmp_path)]) == 2


def test_robustness_sweep_prints_the_comparison(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rows.json"
    assert main(["robustness", "--scale", "16", "--sweep", "cores", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "tangram / best" in printed and "exec static / tangram" in printed
    rows = json.loads(out.read_text())
    assert [row["cores"] for row in rows] == [48, 112, 160, 240]
    for row in rows:
        assert set(row["mean"]) == {"tangram", "tangram:ersa", "fixed-dop-4", "fixed-dop-8",
                                    "fixed-dop-16", "static"}
        assert row["ideal_external"] <= min(row["external"].values())


@pytest.mark.parametrize("argv, problem", [
    (["coding", "--systems", "tangram,bogus"], "unknown system 'bogus'"),
    (["coding", "--policy", "nope"], "unknown policy 'nope'"),
    (["coding", "--batch", "-5"], "--batch must be a positive integer, not -5"),
    (["coding", "--gpus", "0"], "--gpus must be a positive integer, not 0"),
    (["coding", "--cores", "1000"], "cores must be a multiple of 256"),
    (["coding", "--sweep", "cores", "--points", "256,300"], "cores must be a multiple of 256"),
    (["coding", "--sweep", "batch", "--points", "8,abc"], "'abc' is not a number"),
    (["coding", "--sweep", "batch", "--points", "8.5"], "positive integers, not 8.5"),
    (["coding", "--sweep", "parallel", "--points", "0.5,1.5"], r"\[0, 1\], not 1.5"),
    (["coding", "--points", "8"], "add --sweep"),
    (["coding", "--group", "0"], "--group must be a positive integer"),
    (["coding", "--seeds", "1,x"], "--seeds: 'x' is not an integer"),
    (["coding", "--seeds", "2,2"], "each seed once"),
    (["mopd", "--mode", "real", "--seeds", "1,2"], "run the real MOPD stack once per --seed"),
    (["coding", "--mode", "real", "--group", "4"], "--group applies to the simulated"),
    (["trace", "--trace", "/nonexistent/mine.jsonl"], "cannot read the trace file"),
    (["mopd", "--gpus", "8", "--batch", "4", "--systems", "static", "--costs", "sched"],
     "no system could run"),
])
def test_bad_arguments_are_refused_before_anything_runs_or_is_written(
    argv: list[str], problem: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    assert re.search(problem, capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


def test_a_section_run_on_oracle_durations_is_labelled_an_ablation(tmp_path: Path) -> None:
    assert main(["coding", "--batch", "8", "--cores", "256", "--systems", "tangram,static",
                 "--costs", "sched", "--durations", "oracle", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "bench" / "coding-sim.md").read_text()
    assert "durations told to the policies: `oracle` (an ablation:" in text
