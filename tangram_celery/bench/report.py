"""The Markdown report of one ``tangram bench`` invocation, and the results index (pure).

A section starts with the exact command that produced it, the setup and the cost flags with
their sources, then the headline ratios (baseline / tangram, once per cost preset), a comparison
of the systems, one table per system, the sweep table and the plots.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tangram_celery.bench.sim.costs import LABELS, PRESETS, describe
from tangram_celery.bench.summary import Summary
from tangram_celery.bench.tables import (
    comparison_table,
    headline_table,
    sweep_table,
    system_table,
)

TITLE = "# Benchmark results"
INTRO = (
    "Produced by `tangram bench` (see each section's command); do not edit by hand: rerun the "
    "commands. Ratios are baseline / tangram (> 1: tangram is faster). *External time per "
    "trajectory* is the sum of a trajectory's action completion times (ACT = queue + exec + "
    "overhead). Cost presets: *scheduling effects alone* charges no control-plane cost to "
    "any system; *with control-plane costs* charges every system the documented costs listed "
    "in its section."
)
ORDER = ("coding-sim", "coding-real", "mopd-sim", "deepsearch-sim")


@dataclass(frozen=True)
class Section:
    """What one invocation produced, for its report section."""

    name: str
    command: str
    setup: str
    costs: tuple[str, ...]
    sweep: str | None
    headline: Sequence[Summary]
    summaries: Sequence[Summary]
    plots: dict[str, str]
    notes: tuple[str, ...] = ()


def section(s: Section) -> str:
    """The Markdown of one section."""
    lines = [f"## {s.name}", "", f"Command: `{s.command}`", "", s.setup, ""]
    lines += [f"- {note}" for note in s.notes]
    if s.notes:
        lines.append("")
    if "cp" in s.costs:
        lines += ["Control-plane cost flags (preset *with control-plane costs*):", "",
                  "| flag | value | source |", "| --- | --- | --- |"]
        lines += [f"| {flag} | {value} | {source} |"
                  for flag, value, source in describe(PRESETS["cp"])]
        lines.append("")
    point = ", ".join(f"{k} {v}" for k, v in s.headline[0].point.items()) if s.headline else ""
    lines += [f"### Headline ratios ({point})", ""]
    lines += [*headline_table(s.headline, s.costs, LABELS), ""]
    lines += ["### Systems side by side", "", *comparison_table(s.headline), ""]
    for summary in s.headline:
        label = LABELS.get(summary.costs, summary.costs)
        lines += [f"#### {summary.system}, {label}", "", *system_table(summary), ""]
    if s.sweep:
        for preset in s.costs:
            lines += [f"### Sweep over {s.sweep}, {LABELS.get(preset, preset)}", "",
                      "Each cell: external time per trajectory s / mean ACT s (external-time "
                      "ratio to tangram).", ""]
            lines += [*sweep_table(s.summaries, s.sweep, preset), ""]
    for caption, path in s.plots.items():
        lines += [f"![{caption}]({path})", ""]
    return "\n".join(lines)


def index(sections: dict[str, str]) -> str:
    """``results.md``: the intro, then every section in a fixed order."""
    def rank(name: str) -> tuple[int, str]:
        prefix = next((i for i, p in enumerate(ORDER) if name.startswith(p)), len(ORDER))
        return prefix, name

    body = [sections[name] for name in sorted(sections, key=rank)]
    return "\n".join([TITLE, "", INTRO, "", *body])
