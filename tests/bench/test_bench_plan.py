"""Which points a sweep runs and where its headline is taken (plain-data tables)."""

from __future__ import annotations

import pytest

from tangram_bench.plan import (
    DEFAULT_MIX,
    Point,
    axis_label,
    axis_value,
    axis_values,
    headline,
    points,
)

BASE = Point()


@pytest.mark.parametrize(("sweep", "values", "base", "swept", "chosen"), [
    ("batch", (256, 1280, 2048), BASE, [256, 1280, 2048], 1280),
    ("batch", (2048, 256), BASE, [256, 1280, 2048], 1280),
    ("batch", (4, 8), Point(batch=8), [4, 8], 8),
    ("cores", (768, 2560), BASE, [768, 1280, 2560], 1280),
    ("gpus", None, BASE, [8, 16, 24, 32, 40], 40),
    ("parallel", None, BASE, [None, 0.5, 0.7, 0.9, 0.99], None),
    ("parallel", (0.5, 0.99), Point(parallel=0.99), [0.5, 0.99], 0.99),
])
def test_a_sweep_runs_its_base_point_and_takes_its_headline_there(
        sweep: str, values: tuple[float, ...] | None, base: Point,
        swept: list[float | None], chosen: float | None) -> None:
    planned = points(base, sweep, values)
    assert [getattr(p, sweep) for p in planned] == swept
    top = headline(planned, base, sweep)
    assert getattr(top, sweep) == chosen
    assert top == base


def test_the_headline_is_never_taken_at_the_last_point_instead_of_the_base() -> None:
    swept = [Point(parallel=v) for v in (0.5, 0.7, 0.9, 0.99)]
    with pytest.raises(ValueError, match="lacks its base point"):
        headline(swept, BASE, "parallel")
    assert headline([BASE], BASE, None) == BASE


@pytest.mark.parametrize(("point", "axis", "value", "label"), [
    ({"batch": 1280, "cores": 1280}, "batch", 1280.0, "1280"),
    ({"batch": 1280, "parallel": 0.99}, "parallel", 0.99, "0.99"),
    ({"batch": 1280}, "parallel", None, DEFAULT_MIX),
])
def test_a_summary_point_names_its_sweep_value(point: dict[str, object], axis: str,
                                              value: float | None, label: str) -> None:
    assert axis_value(point, axis) == value
    assert axis_label(value) == label


def test_sweep_values_are_ordered_with_the_default_mix_first() -> None:
    found = [{"parallel": 0.9}, {}, {"parallel": 0.5}, {"parallel": 0.9}]
    assert axis_values(found, "parallel") == [None, 0.5, 0.9]
