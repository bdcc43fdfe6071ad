"""The robustness grid: its points, one small task on the simulator, its rows and table."""

from __future__ import annotations

import pytest

from tangram_bench import grid
from tangram_bench.grid import FIXED, PAPER, STATIC, TANGRAM, GridPoint, Measured
from tangram_bench.plan import Point, workload_at
from tangram_bench.robustness import main
from tangram_bench.sim.malleable import MalleableKnobs


def test_the_grid_has_every_combination() -> None:
    points = grid.grid_points()
    assert len(points) == 2 * 2 * 2 * 3 == len(set(points))
    assert {p.batch for p in points} == {256, 1280, 2048}
    assert {p.reward_s for p in points} == {20.0, 60.0}
    params = points[-1].params()
    assert (params.test_median_s, params.turns, params.parallel_range) == (60.0, (10, 40),
                                                                          (0.3, 0.9))


def test_a_small_task_runs_every_system() -> None:
    point = grid.scaled(GridPoint(20.0, (8, 24), (0.5, 0.99), 256), 16)
    measured = grid.run_task((point, 1, 16, "learned", grid.SYSTEMS, MalleableKnobs(),
                              grid.CORES))
    bound = measured.pop(grid.BOUND)
    assert set(measured) == set(grid.SYSTEMS)
    assert all(m.external > 0 and m.step > 0 for m in measured.values())
    assert measured["fixed-dop-4"].dop == (4, 4, 4)
    assert 0 < bound.external < min(m.external for m in measured.values())


def runs(tangram: float, fixed4: float) -> dict[str, Measured]:
    found = {name: Measured(100.0, 100.0, 1.0, (4, 4, 4)) for name in grid.SYSTEMS}
    found[TANGRAM] = Measured(tangram, 50.0, 0.5, (2, 3, 8))
    found[PAPER] = Measured(tangram * 1.1, 60.0, 0.6, (1, 2, 16))
    found[FIXED[0]] = Measured(fixed4, 80.0, 0.7, (4, 4, 4))
    found[STATIC] = Measured(90.0, 100.0, 0.5, (4, 4, 4))
    found[grid.BOUND] = Measured(24.0, 0.0, 0.0, (0, 0, 0))
    return found


def test_a_row_takes_the_best_fixed_dop_by_its_mean_and_marks_a_miss() -> None:
    point = GridPoint(20.0, (8, 24), (0.5, 0.99), 1280)
    row = grid.grid_row(point, [runs(30.0, 27.0), runs(30.0, 33.0), runs(30.0, 27.0)])
    assert row.best_fixed == FIXED[0] and row.fixed.mean == pytest.approx(29.0)
    assert (row.vs_fixed.low, row.vs_fixed.high) == (pytest.approx(0.9), pytest.approx(1.1))
    assert row.step_vs_static.mean == pytest.approx(2.0)
    assert row.ceiling.mean == pytest.approx(29.0 / 24.0)
    table = grid.render_grid([row])
    assert "0.967x (0.900-1.100) (miss)" in table and "2/3/8" in table
    section = grid.section_text("tangram bench robustness --grid", "setup", [row], "done")
    assert "### Headline ratios (batch 1280" in section
    assert "| external time per trajectory |" in section


def test_a_bad_durations_value_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--grid", "--durations", "exact"]) == 2
    assert "learned, learned:node, oracle or noisy:SIGMA" in capsys.readouterr().err


def test_the_group_size_is_a_knob_of_the_workload_and_of_the_cli(
        capsys: pytest.CaptureFixture[str]) -> None:
    def suites(point: Point) -> int:
        workload = workload_at("coding", point, 1)
        return len({a.signature for t in workload.trajectories for a in t.actions
                    if a.kind == "test_run"})

    assert suites(Point(batch=32)) == 4 == suites(Point(batch=32, group=8))
    assert suites(Point(batch=32, group=1)) == 32 and suites(Point(batch=32, group=16)) == 2
    assert Point(batch=32, group=4).as_dict()["group"] == 4 and "group" not in Point().as_dict()
    with pytest.raises(ValueError, match="coding workload only"):
        workload_at("mopd", Point(batch=8, group=4), 1)
    assert GridPoint(20.0, (8, 24), (0.5, 0.99), 256, group=2).params().group == 2
    assert main(["--grid", "--group", "0"]) == 2
    assert "--group must be a positive integer" in capsys.readouterr().err


def test_the_malleable_targets_mark_each_miss() -> None:
    from tangram_bench import grid_targets

    def measured(malleable: Measured) -> dict[str, Measured]:
        found = {name: Measured(100.0, 100.0, 1.0, (4, 4, 4), 50.0) for name in grid.SYSTEMS}
        found[FIXED[2]] = Measured(40.0, 90.0, 1.2, (4, 4, 4), 30.0)
        found[STATIC] = Measured(90.0, 200.0, 1.0, (1, 1, 1), 10.0)
        found[grid.MALLEABLE] = malleable
        found[grid.BOUND] = Measured(24.0, 80.0, 0.0, (0, 0, 0))
        return found

    point = GridPoint(20.0, (8, 24), (0.5, 0.99), 1280)
    row = grid_targets.target_row(point, [measured(Measured(38.0, 95.0, 1.001, (1, 2, 8),
                                                           60.0))])
    assert row.best_fixed == FIXED[2] and row.vs_fixed.mean == pytest.approx(40 / 38)
    assert row.misses == ["step time", "exec ACT"]
    assert row.step_vs_bound.mean == pytest.approx(95 / 80) and row.core_s.mean == 60.0
    table = grid_targets.render([row])
    assert "1.053x (1.053-1.053) |" in table and "0.947x (0.947-0.947) (miss)" in table
    assert "(step time, exec ACT)" in grid_targets.summary([row])


def test_the_unseen_seed_section_names_both_systems_and_the_knobs(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--unseen", "7", "--scale", "16", "--grow-cost", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "An unseen seed (7): batch 32 on 32 cores (2 nodes of 16)" in out
    assert "| --grow-cost | 0.5 |" in out
    assert "tangram:malleable: " in out and "tangram: " in out
