"""``tangram bench costs``: the pure summary of its runs (plain-data tables), and the simulator
charging exactly what the committed measurement says."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tangram_bench.costs_report import FIGURES, NAME, Run, Spread, measured, section_text, spread
from tangram_bench.sim import costs
from tangram_bench.sim.costs import CHARGED, charged_costs

ROOT = Path(__file__).resolve().parents[2]
RUNS = [Run(0.010, 0.003, 0.060, 0.40), Run(0.008, 0.002, 0.055, 0.30),
        Run(0.030, 0.010, 0.058, 0.45)]


@pytest.mark.parametrize(("values", "expected"), [
    ([0.005], Spread(0.005, 0.005, 0.005)),
    ([0.003, 0.001, 0.002], Spread(0.002, 0.001, 0.003)),
    ([0.001, 0.002, 0.003, 0.010], Spread(0.0025, 0.001, 0.01)),
    ([0.01234567, 0.01234567], Spread(0.0123, 0.0123, 0.0123)),
])
def test_spread_is_the_median_and_range(values: list[float], expected: Spread) -> None:
    assert spread(values) == expected


def test_spread_of_no_runs_is_an_error() -> None:
    with pytest.raises(ValueError, match="no runs"):
        spread([])


@pytest.mark.parametrize(("run", "dispatch"), [
    (Run(0.010, 0.003, 0.06, 0.4), 0.007),
    (Run(0.048, 0.002, 0.06, 0.4), 0.046),
    (Run(0.002, 0.002, 0.06, 0.4), 0.0),
])
def test_dispatch_is_the_act_less_the_exec(run: Run, dispatch: float) -> None:
    assert run.dispatch_s == pytest.approx(dispatch)


def test_the_measurement_holds_every_figure_over_every_run() -> None:
    data = measured(RUNS, "tangram bench costs --repeat 3", "2026-12-05", "a test machine")
    assert data["runs"] == 3 and len(data["per_run"]) == 3
    assert set(data["figures"]) == set(FIGURES)
    assert data["figures"]["dispatch_s"] == {"median": 0.007, "min": 0.006, "max": 0.02}
    assert data["figures"]["exec_latency_s"] == {"median": 0.058, "min": 0.055, "max": 0.06}
    assert charged_costs(data) == {"dispatch_s": 0.007, "exec_latency_s": 0.058}


def test_the_section_names_its_command_and_shows_the_spread() -> None:
    data = measured(RUNS, "tangram bench costs --repeat 3", "2026-12-05", "a test machine")
    text = section_text(data)
    assert text.startswith(f"## {NAME}\n\nCommand: `tangram bench costs --repeat 3`")
    assert "| dispatch_s |" in text and "7.0 ms (6.0-20.0 ms) | charged: 0.007 s |" in text
    assert "| exec_latency_s |" in text and "58.0 ms (55.0-60.0 ms) | charged: 0.058 s |" in text
    assert len(re.findall(r"^\| [123] \|", text, re.MULTILINE)) == 3


def test_the_simulator_charges_the_committed_measurement() -> None:
    committed = json.loads((ROOT / "tangram_bench" / "sim" / "measured_costs.json").read_text())
    assert committed == costs.MEASURED
    for name in CHARGED:
        assert getattr(costs.CONTROL_PLANE, name) == round(
            committed["figures"][name]["median"], 3)
        assert committed["command"] in costs.SOURCES[name]
    assert costs.SINGLE["dispatch"].dispatch_s == costs.CONTROL_PLANE.dispatch_s
    assert costs.SINGLE["exec"].exec_latency_s == costs.CONTROL_PLANE.exec_latency_s


def test_the_committed_section_is_the_one_the_measurement_makes() -> None:
    committed = json.loads((ROOT / "tangram_bench" / "sim" / "measured_costs.json").read_text())
    published = json.loads((ROOT / "docs" / "bench" / f"{NAME}.json").read_text())
    assert published == committed
    section = (ROOT / "docs" / "bench" / f"{NAME}.md").read_text()
    assert section == section_text(committed) + "\n"
