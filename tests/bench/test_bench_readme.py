"""README's results block: generated from what ``tangram bench`` wrote, kept current."""

from __future__ import annotations

from pathlib import Path

from tangram_celery.bench import report
from tangram_celery.bench.suite import main as bench_main


def test_a_bench_run_rewrites_the_readme_block_from_its_section(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text(
        f"# x\n\nbefore\n\n{report.README_BEGIN}\nold\n{report.README_END}\n\nafter\n")
    assert bench_main(["coding", "--sweep", "batch", "--points", "4,8", "--cores", "256",
                       "--systems", "tangram,static", "--costs", "sched",
                       "--out", str(tmp_path / "docs")]) == 0
    text = (tmp_path / "README.md").read_text()
    block = text.split(report.README_BEGIN)[1].split(report.README_END)[0]
    assert text.startswith("# x\n\nbefore\n\n") and text.endswith("\n\nafter\n")
    assert "old" not in block and "**coding-sim-batch**" in block
    assert "Command: `tangram bench coding --sweep batch" in block
    assert "| static | external time per trajectory |" in block
    assert "| static | mean ACT (all actions) |" not in block
    assert "(docs/bench/coding-sim-batch-sweep.png)" in block
    assert report.main(["--check", "--root", str(tmp_path)]) == 0
    (tmp_path / "README.md").write_text(text.replace("| static |", "| edited |", 1))
    assert report.main(["--check", "--root", str(tmp_path)]) == 1


def test_a_readme_without_markers_is_left_alone() -> None:
    assert report.replace_readme_block("no block here\n", "X") == "no block here\n"


def test_the_repository_readme_block_is_current() -> None:
    assert report.main(["--check"]) == 0, (
        "README.md's results block is stale: run python -m tangram_celery.bench.report")
