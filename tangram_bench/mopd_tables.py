"""The tables of ``tangram bench mopd-parity`` (pure string building over plain runs)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

TANGRAM = "tangram"
TARGETS = {"static-tp4": 0.25, "static": 0.50}
"""Issue 20's targets: tangram's GPUs for equal mean ACT, as a share of each baseline's."""
LABELS = {"static-tp4": "static-tp4 (the paper's: one TP4 replica per teacher)",
          "static": "static (replicas sized in hindsight to the whole run's demand: a favour to "
          "the baseline, which no real deployment has)"}


@dataclass(frozen=True)
class Run:
    """The figures of one simulated run."""

    system: str
    seed: int
    gpus: int
    mean_act: float
    restores: int
    step_s: float
    wall_s: float = 0.0


def gpus_for(curve: Sequence[tuple[int, float]], target: float) -> tuple[float, float]:
    """(swept, interpolated) GPUs at which tangram's mean ACT reaches ``target``: the fewest
    swept GPUs with mean ACT <= target, and the count linearly interpolated between it and the
    swept count below it. Both are the smallest count when even it is at or below the target
    (then it is an upper bound), NaN when no count reaches it."""
    points = sorted(curve)
    for i, (gpus, act) in enumerate(points):
        if act <= target:
            if i == 0:
                return float(gpus), float(gpus)
            below, above = points[i - 1]
            share = (above - target) / (above - act) if above > act else 1.0
            return float(gpus), below + share * (gpus - below)
    return math.nan, math.nan


def spread(values: Sequence[float], fmt: str = "{:.2f}") -> str:
    """``mean (min-max)`` of ``values``; with NaNs (not reached), how many seeds did not."""
    missing = sum(math.isnan(v) for v in values)
    if not values:
        return "n/a"
    if missing:
        return f"not reached on {missing} of {len(values)} seeds"
    low, high = min(values), max(values)
    return f"{fmt.format(statistics.fmean(values))} ({fmt.format(low)}-{fmt.format(high)})"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows)]


def fractions(runs: Sequence[Run], baseline: str) -> list[tuple[int, Run, float, float]]:
    """Per seed: (seed, the baseline's run, swept share, interpolated share) of its GPUs."""
    out = []
    for seed in sorted({r.seed for r in runs}):
        base = next((r for r in runs if r.seed == seed and r.system == baseline), None)
        curve = [(r.gpus, r.mean_act) for r in runs if r.seed == seed and r.system == TANGRAM]
        if base is None or not curve:
            continue
        swept, interpolated = gpus_for(curve, base.mean_act)
        out.append((seed, base, swept / base.gpus, interpolated / base.gpus))
    return out


def _ratios(runs: Sequence[Run], system: str, top: int, field: str,
            gpus: int | None = None) -> list[float]:
    values = []
    for seed in sorted({r.seed for r in runs}):
        mine = next((r for r in runs if r.seed == seed and r.system == system
                     and gpus in (None, r.gpus)), None)
        ref = next((r for r in runs if r.seed == seed and r.system == TANGRAM and r.gpus == top),
                   None)
        if mine is not None and ref is not None and getattr(ref, field) > 0:
            values.append(getattr(mine, field) / getattr(ref, field))
    return values


def headline(runs: Sequence[Run], top: int, statics: Sequence[str],
             pooled: Sequence[str]) -> list[str]:
    """The headline rows: GPU shares against each static baseline; ACT ratios and restores
    against tangram on ``top`` GPUs for every baseline."""
    pct = "{:.0%}"
    rows = []
    for name in statics:
        shares = fractions(runs, name)
        if shares:
            cell = (f"{spread([s[3] for s in shares], pct)} interpolated; "
                    f"{spread([s[2] for s in shares], pct)} swept; of {shares[0][1].gpus} GPUs")
            rows.append([name, "GPUs for equal mean ACT", cell])
    for name in [*statics, *pooled]:
        ratios = _ratios(runs, name, top, "mean_act")
        if ratios:
            rows.append([name, "reward ACT (test run / reward call)",
                         spread(ratios, "{:.2f}x")])
    for name in pooled:
        mine = [float(r.restores) for r in runs if r.system == name]
        ref = [float(r.restores) for r in runs if r.system == TANGRAM and r.gpus == top]
        if mine and ref:
            rows.append([name, "model restores",
                         f"{spread(mine, '{:.0f}')} vs tangram's {spread(ref, '{:.0f}')}"])
    return _table(["baseline", "metric", "mean over seeds (min-max)"], rows)


def systems_table(runs: Sequence[Run], top: int) -> list[str]:
    """One row per (system, GPUs): mean ACT, step time, restores, ratio to tangram on top."""
    keys = list(dict.fromkeys((r.system, r.gpus) for r in runs))
    rows = []
    for system, gpus in keys:
        mine = [r for r in runs if r.system == system and r.gpus == gpus]
        ratio = _ratios(runs, system, top, "mean_act", gpus)
        rows.append([system, str(gpus), spread([r.mean_act for r in mine]),
                     spread([r.step_s for r in mine], "{:.1f}"),
                     spread([float(r.restores) for r in mine], "{:.0f}"),
                     spread(ratio, "{:.2f}x") if ratio else ""])
    return _table(["system", "GPUs", "mean ACT s", "step time s", "model restores",
                   f"mean ACT / tangram's on {top} GPUs"], rows)


def seeds_table(runs: Sequence[Run], statics: Sequence[str]) -> list[str]:
    """Per seed and static baseline: its mean ACT and the GPUs tangram needs for it."""
    rows = []
    for name in statics:
        for seed, base, swept, interpolated in fractions(runs, name):
            rows.append([str(seed), name, str(base.gpus), f"{base.mean_act:.2f}",
                         "n/a" if math.isnan(swept) else f"{swept * base.gpus:.0f} ({swept:.0%})",
                         "n/a" if math.isnan(interpolated)
                         else f"{interpolated * base.gpus:.1f} ({interpolated:.0%})"])
    return _table(["seed", "baseline", "its GPUs", "its mean ACT s", "tangram GPUs, swept",
                   "tangram GPUs, interpolated"], rows)


def verdicts(runs: Sequence[Run]) -> list[str]:
    """One line per target: met or not, with the measured share."""
    lines = []
    for name, goal in TARGETS.items():
        shares = [s[3] for s in fractions(runs, name)]
        if not shares:
            continue
        mean = statistics.fmean(shares)
        state = "met" if not math.isnan(mean) and mean <= goal else "NOT met"
        if math.isnan(mean):
            state += " (tangram does not reach it on the GPUs swept)"
        lines.append(f"- Target: tangram's GPUs for {name}'s mean ACT <= {goal:.0%} of its "
                     f"GPUs (mean of the seeds, interpolated): {state}, "
                     f"{spread(shares, '{:.0%}')}.")
    return lines


def parity_section(name: str, command: str, setup: str, runs: Sequence[Run], top: int,
                   paper: str, oracle: str, pooled: Sequence[str]) -> str:
    """The Markdown section of one ``mopd-parity`` invocation."""
    seeds = ",".join(str(s) for s in sorted({r.seed for r in runs}))
    statics = (paper, oracle)
    lines = [f"## {name}", "", f"Command: `{command}`", "", setup, "",
             *(f"- {LABELS.get(s, s)}" for s in statics), "",
             *verdicts(runs), "",
             f"### Headline ratios (gpus {top}, seeds {seeds})", "",
             *headline(runs, top, statics, pooled), "",
             "Ratios are baseline / tangram on the same seed, tangram on "
             f"{top} GPUs (> 1: tangram is faster).", "",
             "### Systems side by side (mean over seeds, min-max)", "",
             *systems_table(runs, top), "",
             "### GPUs for equal mean ACT, per seed", "",
             *seeds_table(runs, statics), ""]
    return "\n".join(lines)
