"""``tangram bench mopd-parity``: the GPU share at equal mean ACT (plain data) and one tiny run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tangram_bench.mopd_parity import build_parser, main, tasks
from tangram_bench.mopd_tables import Run, fractions, gpus_for, spread

CURVE = [(8, 40.0), (16, 20.0), (24, 10.0), (32, 8.0)]


@pytest.mark.parametrize(("target", "swept", "interpolated"), [
    (20.0, 16, 16.0),
    (15.0, 24, 20.0),
    (30.0, 16, 12.0),
    (50.0, 8, 8.0),
    (8.0, 32, 32.0),
])
def test_gpus_for_reads_the_swept_and_the_interpolated_count(
        target: float, swept: int, interpolated: float) -> None:
    assert gpus_for(CURVE, target) == (swept, pytest.approx(interpolated))


def test_gpus_for_is_nan_when_no_count_reaches_the_target() -> None:
    assert all(math.isnan(v) for v in gpus_for(CURVE, 7.0))


def test_spread_gives_mean_and_range_and_says_what_was_not_reached() -> None:
    assert spread([1.0, 2.0, 3.0]) == "2.00 (1.00-3.00)"
    assert spread([0.5, math.nan], "{:.0%}") == "not reached on 1 of 2 seeds"


def test_fractions_are_per_seed_shares_of_the_baselines_gpus() -> None:
    runs = [Run("tangram", 1, g, a, 0, 1.0) for g, a in CURVE]
    runs += [Run("static-tp4", 1, 36, 15.0, 0, 1.0)]
    [(seed, base, swept, interpolated)] = fractions(runs, "static-tp4")
    assert (seed, base.gpus) == (1, 36)
    assert swept == pytest.approx(24 / 36) and interpolated == pytest.approx(20 / 36)


def test_a_tiny_run_writes_the_section_with_every_baseline(tmp_path: Path) -> None:
    code = main(["--seeds", "1,2", "--batch", "8", "--gpus", "8,40", "--pooled",
                 "celery,celery:cache", "--out", str(tmp_path)])
    assert code == 0
    text = (tmp_path / "bench" / "mopd-sim-parity.md").read_text()
    for needle in ("| static-tp4 | GPUs for equal mean ACT |", "| static | GPUs for equal mean ACT",
                   "| celery:cache | model restores |", "### Headline ratios (gpus 40, seeds 1,2)"):
        assert needle in text
    runs = json.loads((tmp_path / "bench" / "mopd-sim-parity.json").read_text())
    assert {(r["system"], r["seed"]) for r in runs} >= {("static-tp4", 1), ("tangram", 2)}
    assert {r["gpus"] for r in runs if r["system"] == "static-tp4"} == {36}
    assert "mopd-sim-parity" in (tmp_path / "results.md").read_text()
    assert "durations told to the policies: `learned`;" in text


@pytest.mark.parametrize(("durations", "label"), [
    ("oracle", "`oracle` (an ablation"),
    ("noisy:0.5", "`noisy:0.5` (an ablation"),
])
def test_the_durations_mode_reaches_the_runs_and_an_ablation_says_so(
        tmp_path: Path, durations: str, label: str) -> None:
    assert tasks(build_parser().parse_args(["--durations", durations]))[0].durations == durations
    assert main(["--seeds", "1", "--batch", "4", "--gpus", "40", "--pooled", "celery",
                 "--durations", durations, "--tag", "x", "--out", str(tmp_path)]) == 0
    assert label in (tmp_path / "bench" / "mopd-sim-parity-x.md").read_text()


def test_a_durations_mode_it_does_not_know_is_refused() -> None:
    with pytest.raises(SystemExit):
        main(["--durations", "exact"])


def test_gpu_counts_must_be_whole_nodes() -> None:
    with pytest.raises(SystemExit):
        main(["--gpus", "12"])
