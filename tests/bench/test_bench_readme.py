"""README's results block: one generated table row per main section, kept current."""

from __future__ import annotations

import re
from pathlib import Path

from tangram_bench import report
from tangram_bench.suite import main as bench_main
from tangram_bench.summary import Summary

ROOT = Path(__file__).resolve().parents[2]

SECTION = """## coding-sim-batch

Command: `tangram bench coding --mode sim --sweep batch --out docs`

Simulated: CPU nodes of 256 cores; durations told to the policies: `oracle`; points [...].

### Headline ratios (batch 1280, cores 1280, gpus 40)

| baseline | metric | ratio: with control-plane costs | ratio: scheduling effects alone |
| --- | --- | --- | --- |
| static | external time per trajectory | 3.10x (2.96-3.32) | 1.44x (1.42-1.48) |
| static | exec ACT | 4.07x (3.96-4.15) | 0.50x (0.40-0.60) |
| fixed-dop-4 | external time per trajectory | 0.70x (0.60-0.80) | 0.94x (0.92-0.97) |
| celery | external time per trajectory | 1.20x (1.10-1.30) | 1.21x (1.20-1.22) |
| best fixed DoP | external time per trajectory | 0.10x (0.10-0.10), x | 0.10x (0.10-0.10), x |

### Systems side by side

| system | costs | ext. time/traj s |
| --- | --- | --- |
| tangram | sched | 0.01 |
"""

PARITY = """## mopd-sim-parity

Command: `tangram bench mopd-parity --out docs`

### Headline ratios (gpus 40, seeds 1,2,3)

| baseline | metric | mean over seeds (min-max) |
| --- | --- | --- |
| static | GPUs for equal mean ACT | 59% (54%-68%) interpolated; of 40 GPUs |
| static | reward ACT (test run / reward call) | 2.32x (1.94x-2.57x) |
| celery:cache | reward ACT (test run / reward call) | 1.04x (0.90x-1.12x) |
"""


def test_a_row_is_the_closest_baseline_in_the_preferred_preset_column() -> None:
    row = report.brief("coding-sim-batch", SECTION)
    assert row == report.Headline(
        name="coding-sim-batch", point="batch 1280, cores 1280, gpus 40", durations="oracle",
        metric="external time per trajectory", preset="scheduling effects alone",
        baseline="fixed-dop-4", ratio="0.94x (0.92-0.97)", over="n/a")
    assert report.readme_row(row) == (
        "| [coding-sim-batch](docs/results.md#coding-sim-batch) | batch 1280, cores 1280, gpus 40;"
        " durations `oracle` | external time per trajectory, scheduling effects alone "
        "| 0.94x (0.92-0.97) | n/a | fixed-dop-4 |")


def summary(system: str, batch: int, external: float) -> Summary:
    return Summary(system=system, costs="sched", point={"batch": batch, "cores": 1280},
                   kinds=(), external=external, trajectory=external, makespan=1.0, step=1.0,
                   reserved=0.0, used=0.0, decide_calls=0, decide_ms=0.0, sched_share=0.0,
                   seed=1)


def test_a_sweep_row_gives_the_range_over_the_sweeps_points_from_its_summaries() -> None:
    found = [summary("tangram", 256, 10.0), summary("fixed-dop-4", 256, 8.0),
             summary("tangram", 1280, 10.0), summary("fixed-dop-4", 1280, 9.4),
             summary("tangram", 2048, 10.0), summary("fixed-dop-4", 2048, 13.0),
             summary("static", 256, 30.0)]
    row = report.brief("coding-sim-batch", SECTION, found)
    assert row is not None and (row.baseline, row.ratio) == ("fixed-dop-4", "0.94x (0.92-0.97)")
    assert row.over == "0.80x-1.30x"
    assert "| 0.94x (0.92-0.97) | 0.80x-1.30x | fixed-dop-4 |" in report.readme_row(row)
    parity = report.brief("mopd-sim-parity", PARITY, found)
    assert parity is not None and parity.over == "-", "not a sweep"


def test_a_section_without_external_time_shows_reward_act_and_no_invented_mode() -> None:
    row = report.brief("mopd-sim-parity", PARITY)
    assert row is not None
    assert (row.metric, row.baseline, row.ratio) == (
        "reward ACT (test run / reward call)", "celery:cache", "1.04x (0.90x-1.12x)")
    assert row.durations is None and row.preset == "" and row.point == "gpus 40, seeds 1,2,3"
    line = report.readme_row(row, "site")
    assert "durations" not in line and line.startswith("| [mopd-sim-parity](site/results.md#")


def test_a_section_without_a_ratio_has_no_row() -> None:
    assert report.brief("x", "## x\n\nCommand: `tangram bench x`\n") is None
    no_ratio = PARITY.replace("2.32x (1.94x-2.57x)", "n/a").replace("1.04x (0.90x-1.12x)", "-")
    assert report.brief("mopd-sim-parity", no_ratio) is None


def test_the_block_is_one_table_in_the_fixed_order_of_the_chosen_sections() -> None:
    sections = {"mopd-sim-parity": PARITY, "coding-sim-batch": SECTION,
                "coding-sim-cores": SECTION.replace("coding-sim-batch", "coding-sim-cores")}
    block = report.readme_results(sections)
    lines = block.splitlines()
    assert lines[0] == report.README_BEGIN and lines[-1] == report.README_END
    assert "python -m tangram_bench.report" in lines[1] and "(docs/results.md)" in lines[1]
    rows = [line for line in lines if line.startswith("| [")]
    assert [r.split("]")[0] for r in rows] == ["| [coding-sim-batch", "| [mopd-sim-parity"]
    assert sum(line.startswith("| benchmark |") for line in lines) == 1
    assert "coding-sim-cores" not in block
    assert report.UNSTATED_DURATIONS in block, "the parity row names no durations mode"
    assert report.UNSTATED_DURATIONS not in report.readme_results({"coding-sim-batch": SECTION})
    empty = report.readme_results({"coding-sim-cores": SECTION})
    assert "| benchmark |" not in empty and "has been written yet" in empty


def test_the_anchor_is_the_heading_slug() -> None:
    assert report.anchor("mopd-sim-parity-fast-restore") == "mopd-sim-parity-fast-restore"
    assert report.anchor("Coding Sim (a)") == "coding-sim-a"


def test_a_bench_run_rewrites_the_readme_block_from_its_section(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text(
        f"# x\n\nbefore\n\n{report.README_BEGIN}\nold\n{report.README_END}\n\nafter\n")
    assert bench_main(["coding", "--sweep", "batch", "--points", "4,8", "--batch", "8",
                       "--cores", "256", "--systems", "tangram,static", "--costs", "sched",
                       "--out", str(tmp_path / "docs")]) == 0
    text = (tmp_path / "README.md").read_text()
    block = text.split(report.README_BEGIN)[1].split(report.README_END)[0]
    assert text.startswith("# x\n\nbefore\n\n") and text.endswith("\n\nafter\n")
    assert "old" not in block
    assert "| [coding-sim-batch](docs/results.md#coding-sim-batch) |" in block
    assert "| external time per trajectory, scheduling effects alone |" in block
    assert block.rstrip().endswith("x | static |"), "the range over the sweep's points"
    assert report.main(["--check", "--root", str(tmp_path)]) == 0
    (tmp_path / "README.md").write_text(text.replace("| static |", "| edited |", 1))
    assert report.main(["--check", "--root", str(tmp_path)]) == 1


def test_a_readme_without_markers_is_left_alone() -> None:
    assert report.replace_readme_block("no block here\n", "X") == "no block here\n"


def test_the_repository_readme_block_is_current() -> None:
    old, new = report.updated_readme(ROOT / "README.md", ROOT / "docs" / "bench")
    assert old == new, "README.md's results block is stale: run python -m tangram_bench.report"
    assert report.main(["--check", "--root", str(ROOT)]) == 0


def test_the_repository_readme_rows_link_to_sections_of_the_report() -> None:
    block = (ROOT / "README.md").read_text().split(report.README_BEGIN)[1]
    links = re.findall(r"\]\(docs/results\.md#([^)]+)\)", block.split(report.README_END)[0])
    assert len(links) >= 3, "the README's results table has its rows"
    headings = {report.anchor(line[3:]) for line in
                (ROOT / "docs" / "results.md").read_text().splitlines() if line.startswith("## ")}
    assert set(links) <= headings


def test_results_md_holds_each_section_with_its_plots_seen_from_docs() -> None:
    section = "## s\n\n![ACT CDF](s-cdf.png)\n\n![web](https://x.example/p.png)\n"
    text = report.index({"s": section})
    assert "![ACT CDF](bench/s-cdf.png)" in text
    assert "![web](https://x.example/p.png)" in text


def test_the_repository_results_md_is_current() -> None:
    assert report.main(["--check", "--root", str(ROOT)]) == 0, (
        "docs/results.md or README.md's results block is stale: run python -m tangram_bench.report")
