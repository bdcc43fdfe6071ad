"""What each section ``tangram bench`` wrote claims, read back from its Markdown (and the
summaries beside it), and the claims table that opens ``results.md`` (pure).

A claim is a section's headline: tangram against the baseline that comes closest to it, in the
first of ``README_METRICS`` its headline table has, at the section's headline point. The claims
table gives every section that is not an ablation one row: the claim, that baseline, the ratio
with its range over the seeds (and over a sweep's points), the command that wrote the section,
and every baseline, metric, cost preset and sweep point of the section where tangram loses
(ratio < 1.00x). Nothing in it is typed: it is rebuilt from the sections each time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tangram_bench.plan import axis_label
from tangram_bench.sim.costs import LABELS
from tangram_bench.summary import Summary
from tangram_bench.tables import METRICS, REFERENCE, point_ratios, span, sweep_range

README_METRICS = ("external time per trajectory", "reward ACT (test run / reward call)")
"""The metric a row shows: the first of these that the section's headline table has."""
README_PRESET = "ratio: scheduling effects alone"
"""The ratio column a row reads when the table has it; else its first ratio column."""
_DURATIONS = re.compile(r"durations told to the policies: `(?P<mode>[^`]+)`")
SWEEP = re.compile(r"^Command: `tangram bench [^`]*--sweep (?P<axis>\w+)", re.MULTILINE)
_RATIO = re.compile(r"^(?P<value>\d+(?:\.\d+)?)x(?:\s|$)")


@dataclass(frozen=True)
class Headline:
    """One section's README row: tangram against the baseline that comes closest to it."""

    name: str
    point: str
    durations: str | None
    metric: str
    preset: str
    baseline: str
    ratio: str
    over: str = "-"
    """The least and greatest ratio over the sweep's points ("-": not a sweep)."""


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def headline_rows(text: str) -> tuple[str, list[str], list[list[str]]]:
    """The point of a section's "### Headline ratios (...)" table, its header cells and rows."""
    lines = text.splitlines()
    heading = next((line for line in lines if line.startswith("### Headline ratios")), "")
    if not heading:
        return "", [], []
    start = lines.index(heading) + 2
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    table = [_cells(line) for line in lines[start:end]]
    point = heading.removeprefix("### Headline ratios").strip()
    point = point[1:-1] if point.startswith("(") and point.endswith(")") else point
    return point, table[0] if table else [], table[2:]


def brief(name: str, text: str, summaries: Sequence[Summary] = ()) -> Headline | None:
    """The README row of one section, taken from the section that ``tangram bench`` wrote: in
    its headline table, the first of ``README_METRICS`` it has, in the ``README_PRESET`` column
    (else the first ratio column), the baseline with the lowest ratio (the closest to tangram;
    "best ..." summary rows are skipped as they repeat a baseline's row). For a sweep, the
    range of that ratio over the sweep's points, from the section's ``summaries`` (every
    point's). None when the section has no such ratio."""
    point, header, rows = headline_rows(text)
    if len(header) < 3:
        return None
    column = header.index(README_PRESET) if README_PRESET in header else 2
    preset = header[column].removeprefix("ratio: ") if header[column].startswith("ratio: ") else ""
    for metric in README_METRICS:
        ratios = [(float(m["value"]), row[0], row[column]) for row in rows
                  if len(row) > column and row[1] == metric and not row[0].startswith("best ")
                  and (m := _RATIO.match(row[column]))]
        if ratios:
            _, baseline, ratio = min(ratios, key=lambda r: r[0])
            return Headline(name, point, durations(text), metric, preset,
                            baseline, ratio, _over(text, summaries, baseline, preset, metric))
    return None


def _over(text: str, summaries: Sequence[Summary], baseline: str, preset: str,
          metric: str) -> str:
    swept = SWEEP.search(text)
    if not swept:
        return "-"
    key = next((k for k, label in LABELS.items() if label == preset), preset)
    measure = dict(METRICS).get(metric)
    if measure is None:
        return "n/a"
    return span(sweep_range(summaries, swept["axis"], baseline, key, measure))


def anchor(name: str) -> str:
    """The anchor GitHub and mkdocs give the heading ``## name``."""
    return re.sub(r"[^\w\- ]", "", name.strip().lower()).replace(" ", "-")


ABLATION = "(an ablation"
"""How a section's setup says it is an ablation (what the policies were told is not what a
real pool can know)."""
_COMMAND = re.compile(r"^Command: `(?P<command>[^`]+)`", re.MULTILINE)
_NAMED_MODE = re.compile(r", (?P<mode>learned(?::node)?|oracle|noisy:[\d.]+) durations\b")
TIE = 1.0
"""A ratio (as written, to two decimals) below this is a loss for tangram."""


def is_ablation(text: str) -> bool:
    """Whether a section says it is an ablation."""
    return ABLATION in text


def command(text: str) -> str | None:
    """The command on a section's ``Command:`` line."""
    found = _COMMAND.search(text)
    return found["command"] if found else None


def durations(text: str) -> str | None:
    """The durations mode a section says its policies were told (None: it does not say)."""
    found = _DURATIONS.search(text) or _NAMED_MODE.search(text)
    return found["mode"] if found else None


@dataclass(frozen=True)
class Loss:
    """A baseline that beats tangram in a section: on ``metric``, by ``ratio`` (baseline /
    tangram, < 1.00x), ``where`` ("": at the claim's point and cost preset; else the other
    preset or sweep point)."""

    baseline: str
    metric: str
    ratio: str
    where: str = ""


def _lost(cell: str) -> str | None:
    found = _RATIO.match(cell)
    return f"{found['value']}x" if found and float(found["value"]) < TIE else None


def headline_losses(text: str, preset: str) -> list[Loss]:
    """Every (baseline, metric) of a section's headline table whose ratio is below 1.00x:
    first in the ``preset`` column (the claim's), then the pairs that lose only under another
    ratio column ("best ..." rows repeat a baseline's and are skipped)."""
    _, header, rows = headline_rows(text)
    columns = [i for i in range(2, len(header)) if not header[i].startswith("over the ")]
    first = [i for i in columns if header[i].removeprefix("ratio: ") == preset] or columns[:1]
    found: list[Loss] = []
    for i in [*first, *(c for c in columns if c not in first)]:
        where = "" if i in first else f"({header[i].removeprefix('ratio: ')})"
        for row in rows:
            if len(row) <= i or row[0].startswith("best "):
                continue
            ratio = _lost(row[i])
            seen = any((x.baseline, x.metric) == (row[0], row[1]) for x in found)
            if ratio and not (where and seen):
                found.append(Loss(row[0], row[1], ratio, where))
    return found


def closest_per_metric(text: str, preset: str) -> list[tuple[str, str, str]]:
    """Per metric of a section's headline table, in its order: the baseline with the lowest
    ratio in the ``preset`` column (else the first ratio column) and that ratio ("best ..."
    rows repeat a baseline's and are skipped)."""
    _, header, rows = headline_rows(text)
    labels = [h.removeprefix("ratio: ") for h in header]
    column = labels.index(preset) if preset in labels[2:] else 2
    best: dict[str, tuple[float, str, str]] = {}
    for row in rows:
        found = _RATIO.match(row[column]) if len(row) > column else None
        if found and not row[0].startswith("best "):
            value = float(found["value"])
            if row[1] not in best or value < best[row[1]][0]:
                best[row[1]] = (value, row[0], f"{found['value']}x")
    return [(metric, baseline, ratio) for metric, (_, baseline, ratio) in best.items()]


def _value(point: str, axis: str) -> float | None:
    found = re.search(rf"(?:^|, ){re.escape(axis)} (?P<v>[\d.]+)", point)
    return float(found["v"]) if found else None


def point_losses(summaries: Sequence[Summary], axis: str, preset: str,
                 headline: float | None) -> list[Loss]:
    """Every baseline, metric and sweep point other than the ``headline`` value of ``axis``
    where the ratio baseline / tangram under cost preset ``preset`` is below 1.00x."""
    baselines = dict.fromkeys(s.system for s in summaries if s.system != REFERENCE)
    return [Loss(baseline, name, f"{ratio:.2f}x", f"at {axis} {axis_label(point)}")
            for baseline in baselines for name, metric in METRICS
            for point, ratio in point_ratios(summaries, axis, baseline, preset, metric)
            if point != headline and round(ratio, 2) < TIE]


def where_it_loses(losses: Sequence[Loss]) -> str:
    """The losses as one table cell: per baseline (in bold), per metric, each ratio with
    where it was measured when that is not the claim's point and preset."""
    if not losses:
        return "nowhere in this section"
    by: dict[str, dict[str, list[str]]] = {}
    for x in losses:
        by.setdefault(x.baseline, {}).setdefault(x.metric, []).append(
            f"{x.ratio} {x.where}".strip())
    return "; ".join(f"**{baseline}**: " + "; ".join(f"{metric} {', '.join(ratios)}"
                                                       for metric, ratios in metrics.items())
                     for baseline, metrics in by.items())


@dataclass(frozen=True)
class Claim:
    """One row of the claims table."""

    headline: Headline
    command: str
    losses: tuple[Loss, ...]
    closest: tuple[tuple[str, str, str], ...] = ()
    """Per metric of the headline table: (metric, closest baseline, its ratio)."""


def claim(name: str, text: str, summaries: Sequence[Summary] = ()) -> Claim | None:
    """A section's claim (None: an ablation, or no ratio in its headline table)."""
    h = brief(name, text, summaries)
    if h is None or is_ablation(text):
        return None
    losses = headline_losses(text, h.preset)
    swept = SWEEP.search(text)
    if swept and summaries:
        key = next((k for k, label in LABELS.items() if label == h.preset), h.preset)
        losses += point_losses(summaries, swept["axis"], key, _value(h.point, swept["axis"]))
    return Claim(h, command(text) or "n/a", tuple(losses),
                 tuple(closest_per_metric(text, h.preset)))


UNSTATED = ("durations not stated: read as an oracle figure (the real coding stack's emulated "
            "actions declare their exact durations)")
"""The claim cell's note for a section that does not say what its policies were told."""
CLAIMS_TITLE = "## Claims at a glance"
CLAIMS_HEADER = ("| claim | closest baseline | ratio (range over seeds) "
                 "| closest baseline per metric | command | where tangram loses |",
                 "| --- | --- | --- | --- | --- | --- |")


def claim_row(c: Claim) -> str:
    """One row of the claims table."""
    h = c.headline
    told = f"durations `{h.durations}`" if h.durations else UNSTATED
    preset = f", {h.preset}" if h.preset else ""
    ratio = h.ratio if "(" in h.ratio else f"{h.ratio} (one seed)"
    if h.over not in ("-", "n/a"):
        ratio += f"; over the sweep's points {h.over}"
    per_metric = "; ".join(f"{metric}: {baseline} {value}"
                           for metric, baseline, value in c.closest) or "n/a"
    return (f"| [{h.name}](#{anchor(h.name)}): {h.metric}{preset}, at {h.point}; {told} "
            f"| {h.baseline} | {ratio} | {per_metric} | `{c.command}` "
            f"| {where_it_loses(c.losses)} |")


def claims_table(sections: Mapping[str, str], order: Sequence[str],
                 summaries: Mapping[str, Sequence[Summary]] | None = None) -> list[str]:
    """The table that opens ``results.md``: one row per section of ``order`` in ``sections``
    that makes a claim (``summaries``: a sweep section's, for its points), then which sections
    are ablations and so make none."""
    found = summaries or {}
    claims = [c for name in order if name in sections
              and (c := claim(name, sections[name], found.get(name, ()))) is not None]
    ablations = [name for name in order if name in sections and is_ablation(sections[name])]
    lines = [CLAIMS_TITLE, "",
             "One row per section below that is not an ablation, read from the section: its "
             "headline (the first of external time per trajectory and reward ACT its headline "
             "table has, at its headline point, scheduling effects alone where it has that "
             "column), the baseline with the lowest ratio there, that ratio (baseline / "
             "tangram, > 1: tangram is faster) with its range over the seeds, the command that "
             "wrote the section, and every baseline, metric, cost preset and sweep point of "
             "the section where a baseline beats tangram (ratio < 1.00x, the mean over seeds). "
             "*Closest baseline per metric*: in the claim's column of the headline table, the "
             "baseline with the lowest ratio on each metric.",
             ""]
    lines += [*CLAIMS_HEADER, *(claim_row(c) for c in claims)] if claims else ["No claims yet."]
    if ablations:
        lines += ["", f"Ablations, not claims (each says so in its setup): "
                      f"{', '.join(f'[{n}](#{anchor(n)})' for n in ablations)}."]
    return [*lines, ""]
