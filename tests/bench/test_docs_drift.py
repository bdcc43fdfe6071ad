"""A generated section of the docs is exactly what its named command writes today: rerun it and
compare, so neither a hand edit nor a change of code can leave it stale unnoticed."""

from __future__ import annotations

import re
import shlex
from itertools import takewhile
from pathlib import Path

import pytest

from tangram_bench.report import cost_lines
from tangram_bench.sim.costs import LABELS, PRESETS
from tangram_bench.suite import main

ROOT = Path(__file__).resolve().parents[2]
SECTION = "mopd-sim-small"
"""A small simulated section (MOPD on 24 GPUs, three seeds) whose command runs in seconds."""
COMMAND = re.compile(r"^Command: `tangram bench (?P<argv>[^`]+)`$", re.MULTILINE)
MACHINE = (
    (re.compile(r"in [\d.,]+ s of simulation wall time"), "in <s> s of simulation wall time"),
    (re.compile(r"[\d.]+ ms/call, [\d.]+% of mean ACT"), "<ms> ms/call, <share> of mean ACT"),
)
"""The only figures that measure this machine, not the simulation: the wall time of the runs
and the policy's own compute time per call. Everything else must match to the character."""


def stable(text: str) -> str:
    """``text`` with this machine's timings masked."""
    for pattern, mask in MACHINE:
        text = pattern.sub(mask, text)
    return text


def committed() -> str:
    return (ROOT / "docs" / "bench" / f"{SECTION}.md").read_text()


def test_the_committed_section_is_what_its_command_writes(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    text = committed()
    argv = shlex.split(COMMAND.search(text)["argv"])  # type: ignore[index]
    assert argv[argv.index("--out") + 1] == "docs"
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 0
    fresh = (tmp_path / "docs" / "bench" / f"{SECTION}.md").read_text()
    assert stable(fresh) == stable(text), (
        f"docs/bench/{SECTION}.md is stale or was edited by hand: rerun its command from the "
        "repository root, then python -m tangram_bench.report")


def test_a_hand_edit_of_any_figure_is_not_masked() -> None:
    text = committed()
    ratio = re.search(r"\| (\d+\.\d\d)x", text)
    assert ratio is not None, "the section has ratios"
    edited = text.replace(ratio[0], f"| {float(ratio[1]) + 0.01:.2f}x", 1)
    assert stable(edited) != stable(text)
    assert stable(text).count("<s> s of simulation wall time") == 1
    assert "ms/call" not in stable(text).replace("<ms> ms/call", "")


def presets_charged(text: str) -> list[str]:
    """The cost presets a section's "Control-plane cost presets" table lists, by key."""
    keys = {label: key for key, label in LABELS.items()}
    lines = text.splitlines()
    if COST_TABLE not in lines:
        return []
    start = lines.index(COST_TABLE) + 4
    rows = takewhile(lambda line: line.startswith("| "), lines[start:])
    return [keys[row.split(" | ")[0].removeprefix("| ")] for row in rows]


COST_TABLE = "Control-plane cost presets (each charges the flags named, every other cost off):"


@pytest.mark.parametrize("path", sorted((ROOT / "docs" / "bench").glob("*.md")),
                         ids=lambda p: p.stem)
def test_every_section_charges_todays_costs(path: Path) -> None:
    text = path.read_text()
    presets = presets_charged(text)
    assert "\n".join(cost_lines(presets)) in text, (
        f"{path.name} charged control-plane costs other than sim/costs.py's (measured by "
        "`tangram bench costs`): rerun its command")


def test_a_section_with_other_costs_is_caught() -> None:
    text = committed()
    table = "\n".join(cost_lines(["cp"]))
    stale = table.replace(f"dispatch_s {PRESETS['cp'].dispatch_s}", "dispatch_s 0.046")
    assert presets_charged(text + "\n" + stale) == ["cp"]
    assert table not in text + "\n" + stale
