"""The Markdown report of one ``tangram bench`` invocation, and the results index (pure).

A section starts with the exact command that produced it, the setup and the cost flags with
their sources, then the headline ratios (baseline / tangram, once per cost preset), a comparison
of the systems, one table per system (of the first seed), the sweep tables (external time per
trajectory and RL step time) and the plots. With several seeds every figure is the mean over
them with the range in brackets.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tangram_bench.claims import SWEEP, Headline, anchor, brief, claims_table
from tangram_bench.sim.costs import LABELS, OPERATOR, PRESETS, describe
from tangram_bench.summary import Summary, from_json
from tangram_bench.tables import (
    comparison_table,
    headline_table,
    ordered_presets,
    sweep_table,
    system_table,
)

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
    over = (s.sweep, s.summaries) if s.sweep else None
    lines += [*headline_table(s.headline, s.costs, LABELS, over), ""]
    lines += ["### Systems side by side", "", *comparison_table(s.headline), ""]
    seeds = list(dict.fromkeys(summary.seed for summary in s.headline))
    which = f", seed {seeds[0]}" if len(seeds) > 1 else ""
    for summary in (x for x in s.headline if x.seed == seeds[0]):
        label = LABELS.get(summary.costs, summary.costs)
        lines += [f"#### {summary.system}, {label}{which}", "", *system_table(summary), ""]
    if s.sweep:
        for preset in ordered_presets(s.costs):
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
    lines += ["", "| flag | what an operator would set | source |", "| --- | --- | --- |"]
    lines += [f"| {flag} | {OPERATOR[flag]} | {source} |" for flag, source in sources.items()]
    return [*lines, ""]


_LOCAL_IMAGE = re.compile(r"(!\[[^\]]*\]\()(?![a-zA-Z][a-zA-Z0-9+.-]*:|/)")


def embedded(text: str) -> str:
    """A section as ``results.md`` holds it: its plots lie beside it in ``bench/``, so a path
    relative to the section is ``bench/<path>`` from ``results.md``."""
    return _LOCAL_IMAGE.sub(r"\1bench/", text)


def index(sections: Mapping[str, str],
          summaries: Mapping[str, Sequence[Summary]] | None = None) -> str:
    """``results.md``: the intro, the claims table (:func:`claims_table`: the README's
    sections first; ``summaries``: each sweep section's), then every section in a fixed
    order."""
    def rank(name: str) -> tuple[int, str]:
        prefix = next((i for i, p in enumerate(ORDER) if name.startswith(p)), len(ORDER))
        return prefix, name

    ordered = sorted(sections, key=rank)
    first = [name for name in README_SECTIONS if name in sections]
    claims = claims_table(sections, [*first, *(n for n in ordered if n not in first)],
                          summaries)
    body = [embedded(sections[name]) for name in ordered]
    return "\n".join([TITLE, "", INTRO, "", *claims, *body])


def read_sections(bench_dir: Path) -> dict[str, str]:
    """Every section ``tangram bench`` wrote under ``bench_dir``, by name."""
    return {path.stem: path.read_text() for path in sorted(bench_dir.glob("*.md"))}


def read_summaries(bench_dir: Path, names: Sequence[str]) -> dict[str, list[Summary]]:
    """The summaries ``tangram bench`` wrote beside each section of ``names`` that is a sweep
    (``<name>.json``)."""
    found = {}
    for name in names:
        path, section = bench_dir / f"{name}.json", bench_dir / f"{name}.md"
        if path.is_file() and section.is_file() and SWEEP.search(section.read_text()):
            found[name] = from_json(json.loads(path.read_text()))
    return found


def rebuilt(bench_dir: Path) -> str:
    """``results.md`` as the sections in ``bench_dir`` (and their summaries) make it."""
    sections = read_sections(bench_dir)
    return index(sections, read_summaries(bench_dir, list(sections)))


def publish(out: Path, name: str, text: str) -> None:
    """Write section ``name`` to ``out/bench/name.md``, then rebuild ``out/results.md`` and the
    results block of the README beside ``out`` from every section there."""
    folder = out / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.md").write_text(text + "\n")
    (out / "results.md").write_text(rebuilt(folder))
    readme = out.parent / "README.md"
    if readme.is_file() and write_readme(readme, folder):
        print(f"updated the results block of {readme}", file=sys.stderr)


README_BEGIN = "<!-- results:begin -->"
README_END = "<!-- results:end -->"
README_SECTIONS = ("coding-sim-batch", "coding-real", "mopd-sim-parity", "mopd-real",
                   "deepsearch-sim-batch")
"""The sections the README's table shows, in its order: the first of each family of ``ORDER``
and the real-stack ones. A section missing from ``docs/bench`` is left out."""
def readme_row(h: Headline, docs: str = "docs") -> str:
    """One row of the README's results table."""
    at = h.point + (f"; durations `{h.durations}`" if h.durations else "")
    metric = h.metric + (f", {h.preset}" if h.preset else "")
    return (f"| [{h.name}]({docs}/results.md#{anchor(h.name)}) | {at} | {metric} | {h.ratio} "
            f"| {h.over} | {h.baseline} |")


UNSTATED_DURATIONS = (
    "A row without a durations mode comes from a section that does not say what the policies "
    "were told: read it as an oracle figure (sections written before the GPU side and the "
    "real coding stack learned gave the policies exact durations).")
"""The note under the table when a row's section does not name its durations mode."""
README_HEADER = ("| benchmark | measured at | metric | tangram vs the closest baseline "
                 "| over the sweep's points | closest baseline |",
                 "| --- | --- | --- | --- | --- | --- |")


def readme_results(sections: Mapping[str, str], docs: str = "docs",
                   summaries: Mapping[str, Sequence[Summary]] | None = None) -> str:
    """The README's results block: one row per section of ``README_SECTIONS`` found in
    ``sections`` (``summaries``: each section's, for the range over a sweep's points), with a
    pointer to the full report. Generated, never edited by hand."""
    found = summaries or {}
    rows = [h for name in README_SECTIONS if name in sections
            and (h := brief(name, sections[name], found.get(name, ()))) is not None]
    body = [f"Generated by `python -m tangram_bench.report` from [{docs}/results.md]"
            f"({docs}/results.md); ratios are baseline / tangram, > 1 means tangram is faster. "
            "Each row: from that section's headline table (taken at the sweep's base point), "
            "the baseline with the lowest ratio (the closest to tangram); (min-max): the range "
            "over its seeds; over the sweep's points: that ratio's least and greatest value "
            "over every point of the section's sweep (-: not a sweep).", ""]
    if rows:
        body += [*README_HEADER, *(readme_row(h, docs) for h in rows)]
        if any(h.durations is None for h in rows):
            body += ["", UNSTATED_DURATIONS]
    else:
        body.append(f"No section of {', '.join(README_SECTIONS)} has been written yet.")
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
    sections = read_sections(bench_dir)
    docs = bench_dir.parent.relative_to(readme.parent).as_posix()
    old = readme.read_text()
    block = readme_results(sections, docs, read_summaries(bench_dir, README_SECTIONS))
    return old, replace_readme_block(old, block)


def write_readme(readme: Path, bench_dir: Path) -> bool:
    """Rewrite ``readme``'s results block from the sections in ``bench_dir``; True if it
    changed."""
    old, new = updated_readme(readme, bench_dir)
    if new != old:
        readme.write_text(new)
    return new != old


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tangram_bench.report [--check]``: rebuild ``docs/results.md`` and README.md's
    results block from the sections in ``docs/bench`` (``--check``: exit 1 if either is
    stale)."""
    parser = argparse.ArgumentParser(prog="python -m tangram_bench.report",
                                     description=main.__doc__)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args(argv)
    readme, bench_dir = args.root / "README.md", args.root / "docs" / "bench"
    results = bench_dir.parent / "results.md"
    report = rebuilt(bench_dir)
    if args.check:
        old, new = updated_readme(readme, bench_dir)
        return int(new != old or not results.is_file() or results.read_text() != report)
    results.write_text(report)
    print("updated" if write_readme(readme, bench_dir) else "unchanged", readme)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
