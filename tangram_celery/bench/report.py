"""The Markdown report of one ``tangram bench`` invocation, and the results index (pure).

A section starts with the exact command that produced it, the setup and the cost flags with
their sources, then the headline ratios (baseline / tangram, once per cost preset), a comparison
of the systems, one table per system (of the first seed), the sweep tables (external time per
trajectory and RL step time) and the plots. With several seeds every figure is the mean over
them with the range in brackets.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tangram_celery.bench.summary import Summary
from tangram_celery.bench.tables import (
    comparison_table,
    headline_table,
    sweep_table,
    system_table,
)
from tangram_celery.sim.costs import LABELS, PRESETS, describe

SWEPT = (("external time per trajectory", lambda s: s.external),
         ("RL step time (the step's last trajectory's end)", lambda s: s.step))

TITLE = "# Benchmark results"
INTRO = (
    "Produced by `tangram bench` (see each section's command); do not edit by hand: rerun the "
    "commands. Ratios are baseline / tangram (> 1: tangram is faster). *External time per "
    "trajectory* is the sum of a trajectory's action completion times (ACT = queue + exec + "
    "overhead); the *RL step time* is the end of the step's last trajectory. Where a section "
    "ran several seeds, a figure is the mean over them and (min-max) their range; a ratio is "
    "the mean of each seed's ratio. Cost presets: *scheduling effects alone* charges no "
    "control-plane cost to any system; *with control-plane costs* charges every system the "
    "documented costs listed in its section; a single-cost preset charges one of them alone."
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
    lines += cost_lines(s.costs)
    point = ", ".join(f"{k} {v}" for k, v in s.headline[0].point.items()) if s.headline else ""
    lines += [f"### Headline ratios ({point})", ""]
    lines += [*headline_table(s.headline, s.costs, LABELS), ""]
    lines += ["### Systems side by side", "", *comparison_table(s.headline), ""]
    seeds = list(dict.fromkeys(summary.seed for summary in s.headline))
    which = f", seed {seeds[0]}" if len(seeds) > 1 else ""
    for summary in (x for x in s.headline if x.seed == seeds[0]):
        label = LABELS.get(summary.costs, summary.costs)
        lines += [f"#### {summary.system}, {label}{which}", "", *system_table(summary), ""]
    if s.sweep:
        for preset in s.costs:
            for title, metric in SWEPT:
                lines += [f"### Sweep over {s.sweep}, {LABELS.get(preset, preset)}: {title}",
                          "", "Each cell: seconds (ratio to tangram, > 1: tangram is faster).",
                          ""]
                lines += [*sweep_table(s.summaries, s.sweep, preset, metric), ""]
    for caption, path in s.plots.items():
        lines += [f"![{caption}]({path})", ""]
    return "\n".join(lines)


def cost_lines(presets: Sequence[str]) -> list[str]:
    """The flags each control-plane cost preset charges, then each flag's source."""
    charged = [p for p in presets if p in PRESETS and describe(PRESETS[p])]
    if not charged:
        return []
    lines = ["Control-plane cost presets (each charges the flags named, every other cost off):",
             "", "| preset | flags |", "| --- | --- |"]
    lines += [f"| {LABELS.get(p, p)} | "
              f"{', '.join(f'{flag} {value}' for flag, value, _ in describe(PRESETS[p]))} |"
              for p in charged]
    sources = {flag: source for p in charged for flag, _, source in describe(PRESETS[p])}
    lines += ["", "| flag | source |", "| --- | --- |"]
    lines += [f"| {flag} | {source} |" for flag, source in sources.items()]
    return [*lines, ""]


def index(sections: dict[str, str]) -> str:
    """``results.md``: the intro, then every section in a fixed order."""
    def rank(name: str) -> tuple[int, str]:
        prefix = next((i for i, p in enumerate(ORDER) if name.startswith(p)), len(ORDER))
        return prefix, name

    body = [sections[name] for name in sorted(sections, key=rank)]
    return "\n".join([TITLE, "", INTRO, "", *body])


README_BEGIN = "<!-- results:begin -->"
README_END = "<!-- results:end -->"
README_METRICS = ("external time per trajectory", "exec ACT", "reward ACT (test run / reward call)",
                  "makespan / step time", "GPUs for equal mean ACT", "model restores")
_PLOT = re.compile(r"^!\[(?P<caption>[^\]]*)\]\((?P<path>[^)]+)\)$")


def brief(name: str, text: str, docs: str = "docs") -> list[str]:
    """The README lines of one section: its command, the headline ratios of external time and
    of each action kind, and its sweep plot (else its first plot), all taken from the section
    that ``tangram bench`` wrote."""
    lines = text.splitlines()
    command = next((line for line in lines if line.startswith("Command: ")), "")
    heading = next((line for line in lines if line.startswith("### Headline ratios")), "")
    table: list[str] = []
    if heading:
        start = lines.index(heading) + 2
        end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")),
                   len(lines))
        header, rows = lines[start:start + 2], lines[start + 2:end]
        table = [*header, *(r for r in rows if any(f"| {m} |" in r for m in README_METRICS))]
    plots = [m for line in lines if (m := _PLOT.match(line))]
    plot = next((m for m in plots if "against" in m["caption"]), plots[0] if plots else None)
    point = heading.removeprefix("### Headline ratios").strip(" ()")
    out = [f"**{name}** ({point}). {command}", "", *table]
    if plot is not None:
        out += ["", f"![{name}: {plot['caption']}]({docs}/{plot['path']})"]
    return out


def readme_results(sections: Mapping[str, str], docs: str = "docs") -> str:
    """The README's results block: a short brief per section in the report's order, with a
    pointer to the full report. Generated, never edited by hand."""
    def rank(name: str) -> tuple[int, str]:
        prefix = next((i for i, p in enumerate(ORDER) if name.startswith(p)), len(ORDER))
        return prefix, name

    body = [f"Generated by `tangram bench` from [{docs}/results.md]({docs}/results.md) "
            "(ratios are baseline / tangram, > 1: tangram is faster); rerun a section's command "
            "to refresh it."]
    for name in sorted(sections, key=rank):
        body += ["", *brief(name, sections[name], docs)]
    return "\n".join([README_BEGIN, *body, README_END])


def replace_readme_block(readme: str, block: str) -> str:
    """``readme`` with its results block replaced (unchanged when it has no markers)."""
    if README_BEGIN not in readme or README_END not in readme:
        return readme
    head, rest = readme.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    return head + block + tail


def updated_readme(readme: Path, bench_dir: Path) -> tuple[str, str]:
    """``readme``'s text now, and with its results block rebuilt from ``bench_dir``."""
    sections = {path.stem: path.read_text() for path in sorted(bench_dir.glob("*.md"))}
    docs = bench_dir.parent.relative_to(readme.parent).as_posix()
    old = readme.read_text()
    return old, replace_readme_block(old, readme_results(sections, docs))


def write_readme(readme: Path, bench_dir: Path) -> bool:
    """Rewrite ``readme``'s results block from the sections in ``bench_dir``; True if it
    changed."""
    old, new = updated_readme(readme, bench_dir)
    if new != old:
        readme.write_text(new)
    return new != old


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tangram_celery.bench.report [--check]``: rebuild README.md's results block
    from ``docs/bench`` (``--check``: exit 1 if it is stale)."""
    parser = argparse.ArgumentParser(prog="python -m tangram_celery.bench.report",
                                     description=main.__doc__)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2])
    args = parser.parse_args(argv)
    readme, bench_dir = args.root / "README.md", args.root / "docs" / "bench"
    if args.check:
        old, new = updated_readme(readme, bench_dir)
        return int(new != old)
    print("updated" if write_readme(readme, bench_dir) else "unchanged", readme)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
