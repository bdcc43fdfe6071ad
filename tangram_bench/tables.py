"""Markdown tables of benchmark summaries (pure string building)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

from tangram_bench.plan import axis_label, axis_value, axis_values
from tangram_bench.summary import ALL, Summary, ratio

REWARD_KINDS = ("test_run", "reward")
REFERENCE = "tangram"


def _num(value: float, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}" if abs(value) < 1 else f"{value:.{max(digits - 1, 1)}f}"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows)]


def reward_act(summary: Summary) -> float:
    """Mean ACT of the reward kind (test run or reward call), NaN if none."""
    for kind in REWARD_KINDS:
        stats = summary.kind(kind)
        if stats is not None:
            return stats.mean
    return float("nan")


def kind_act(summary: Summary, kind: str) -> float:
    """Mean ACT of ``kind``, NaN if none."""
    stats = summary.kind(kind)
    return stats.mean if stats is not None else float("nan")


def system_table(summary: Summary) -> list[str]:
    """One system's table: ACT statistics per kind, then its run totals."""
    rows = []
    for k in summary.kinds:
        queue, execution, overhead = k.shares
        rows.append([k.kind, str(k.count), _num(k.mean), _num(k.p50), _num(k.p90),
                     _num(k.p99), f"{queue:.0%}", f"{execution:.0%}", f"{overhead:.0%}"])
    lines = _table(["kind", "n", "avg ACT s", "p50 s", "p90 s", "p99 s", "queue", "exec",
                    "overhead"], rows)
    loads = sum(k.loads for k in summary.kinds if k.kind != ALL)
    totals = (f"external time per trajectory {_num(summary.external)} s; trajectory time "
              f"{_num(summary.trajectory)} s; makespan {_num(summary.makespan)} s; step time "
              f"{_num(summary.step)} s; reserved {_num(summary.reserved)} unit-s; used "
              f"{_num(summary.used)} unit-s")
    if summary.decide_calls:
        totals += (f"; scheduler {summary.decide_calls} calls, {summary.decide_ms:.2f} ms/call, "
                   f"{summary.sched_share:.2%} of mean ACT")
    if loads:
        totals += f"; model restores {loads}"
    return [*lines, "", totals + "."]


METRICS = (
    ("external time per trajectory", lambda s: s.external),
    ("mean ACT (all actions)", lambda s: s.mean_act),
    ("exec ACT", lambda s: kind_act(s, "exec")),
    ("reward ACT (test run / reward call)", reward_act),
    ("API ACT", lambda s: kind_act(s, "api")),
    ("makespan / step time", lambda s: s.step),
)


Metric = Callable[[Summary], float]
BySeed = dict[tuple[str, str], dict[int, Summary]]
STEP = ("makespan / step time", METRICS[-1][1])
"""The RL step time: the mean step's end (its last trajectory's), the makespan without steps."""


def spread(values: Sequence[float], times: bool = False) -> str:
    """The mean of ``values`` (NaN dropped), with their range in brackets when there are
    several (seeds); ``times``: written as ratios (``1.23x``)."""
    clean = [v for v in values if not math.isnan(v)]
    if not clean:
        return "n/a"

    def fmt(value: float) -> str:
        return f"{value:.2f}" if times else _num(value)

    mean = fmt(statistics.fmean(clean)) + ("x" if times else "")
    return mean if len(clean) == 1 else f"{mean} ({fmt(min(clean))}-{fmt(max(clean))})"


def by_seed(summaries: Sequence[Summary]) -> BySeed:
    """The summaries per (system, cost preset), each keyed by its seed (one point)."""
    by: BySeed = {}
    for s in summaries:
        by.setdefault((s.system, s.costs), {})[s.seed] = s
    return by


def seed_ratios(mine: dict[int, Summary] | None, ref: dict[int, Summary] | None,
                metric: Metric) -> list[float]:
    """Per seed both ran, ``metric`` of ``mine`` / ``metric`` of ``ref``."""
    if not mine or not ref:
        return []
    return [ratio(metric(mine[seed]), metric(ref[seed])) for seed in mine if seed in ref]


def best_fixed(by: BySeed, preset: str, metric: Metric) -> str | None:
    """The fixed-DoP system with the least mean ``metric`` over the seeds under ``preset``."""
    fixed = [name for name, costs in by if costs == preset and name.startswith("fixed-dop-")]
    return min(fixed, key=lambda n: statistics.fmean(metric(s) for s in by[(n, preset)].values()),
               default=None)


FIRST_PRESET = "sched"
"""The cost preset a headline table shows first: scheduling effects alone."""


def ordered_presets(costs: Sequence[str]) -> list[str]:
    """``costs`` with scheduling effects alone first, the others in their given order."""
    return sorted(costs, key=lambda preset: preset != FIRST_PRESET)


def range_header(axis: str, label: str) -> str:
    """The header of a headline table's column of ratios over a sweep's points."""
    return f"over the {axis} points: {label}"


def headline_table(summaries: Sequence[Summary], costs: Sequence[str],
                   labels: dict[str, str],
                   sweep: tuple[str, Sequence[Summary]] | None = None) -> list[str]:
    """Ratios baseline / tangram for each metric, one column per cost preset (scheduling
    effects alone first): the mean over the seeds of each seed's ratio, and their range; then
    the best fixed DoP's (least external time, resp. step time, over the seeds) with its name,
    and per metric the best baseline's (:func:`closest_cell`) with its name.
    With ``sweep`` (the swept knob and every point's summaries), a column per preset gives the
    least and greatest ratio over the sweep's points (:func:`sweep_range`)."""
    costs = ordered_presets(costs)
    by = by_seed(summaries)
    baselines = list(dict.fromkeys(s.system for s in summaries if s.system != REFERENCE))
    header = ["baseline", "metric", *(f"ratio: {labels.get(c, c)}" for c in costs)]
    if sweep:
        header += [range_header(sweep[0], labels.get(c, c)) for c in costs]
    rows = []
    for baseline in baselines:
        for name, metric in METRICS:
            cells = [spread(seed_ratios(by.get((baseline, preset)), by.get((REFERENCE, preset)),
                                        metric), times=True) for preset in costs]
            if any(c != "n/a" for c in cells):
                if sweep:
                    cells += [span(sweep_range(sweep[1], sweep[0], baseline, preset, metric))
                              for preset in costs]
                rows.append([baseline, name, *cells])
    for name, metric in (METRICS[0], STEP):
        cells = []
        for preset in costs:
            best = best_fixed(by, preset, metric)
            ratios = seed_ratios(by.get((best, preset)) if best else None,
                                 by.get((REFERENCE, preset)), metric)
            cells.append(f"{spread(ratios, times=True)}, {best}" if ratios else "n/a")
        if any(c != "n/a" for c in cells):
            rows.append(["best fixed DoP", name, *cells, *(["n/a"] * len(costs) if sweep else [])])
    if len(baselines) > 1:
        for name, metric in METRICS:
            cells = [closest_cell(by, baselines, preset, metric) for preset in costs]
            if any(c != "n/a" for c in cells):
                rows.append([BEST, name, *cells, *(["n/a"] * len(costs) if sweep else [])])
    return _table(header, rows)


BEST = "best baseline"
"""The headline rows naming, per metric, the baseline that comes closest to tangram."""


def closest_cell(by: BySeed, baselines: Sequence[str], preset: str, metric: Metric) -> str:
    """The baseline with the lowest ratio to tangram on ``metric`` under ``preset`` (the mean
    over the seeds of each seed's ratio), written as its ratio then its name."""
    found = {}
    for baseline in baselines:
        ratios = [r for r in seed_ratios(by.get((baseline, preset)),
                                         by.get((REFERENCE, preset)), metric)
                  if not math.isnan(r)]
        if ratios:
            found[baseline] = ratios
    if not found:
        return "n/a"
    best = min(found, key=lambda name: statistics.fmean(found[name]))
    return f"{spread(found[best], times=True)}, {best}"


def comparison_table(summaries: Sequence[Summary]) -> list[str]:
    """One line per system and preset: the headline metrics side by side (seconds), the mean
    over the seeds with their range."""
    metrics: tuple[Metric, ...] = (
        lambda s: s.external, lambda s: s.step, lambda s: s.mean_act,
        lambda s: kind_act(s, "exec"), reward_act, lambda s: s.trajectory,
        lambda s: s.reserved)
    rows = [[system, costs, *(spread([m(s) for s in runs.values()]) for m in metrics)]
            for (system, costs), runs in by_seed(summaries).items()]
    return _table(["system", "costs", "ext. time/traj s", "RL step time s", "mean ACT s",
                   "exec ACT s", "reward ACT s", "traj. time s", "reserved unit-s"], rows)


def sweep_table(summaries: Sequence[Summary], axis: str, preset: str,
                metric: Metric = METRICS[0][1]) -> list[str]:
    """Per sweep point: each system's ``metric`` (mean and range over the seeds) with its
    ratio to tangram in brackets, then the best fixed DoP's ratio."""
    chosen = [s for s in summaries if s.costs == preset]
    systems = list(dict.fromkeys(s.system for s in chosen))
    points = axis_values([s.point for s in chosen], axis)
    per_point = {point: by_seed([s for s in chosen if axis_value(s.point, axis) == point])
                 for point in points}
    fixed = any(name.startswith("fixed-dop-") for name in systems)
    rows = []
    for point in points:
        by = per_point[point]
        ref = by.get((REFERENCE, preset))
        cells = [axis_label(point)]
        for system in systems:
            mine = by.get((system, preset))
            if mine is None:
                cells.append("n/a")
                continue
            cell = spread([metric(s) for s in mine.values()])
            if ref is not None and system != REFERENCE:
                cell += f" ({spread(seed_ratios(mine, ref, metric), times=True)})"
            cells.append(cell)
        if fixed:
            best = best_fixed(by, preset, metric)
            ratios = seed_ratios(by.get((best, preset)) if best else None, ref, metric)
            cells.append(f"{spread(ratios, times=True)}, {best}" if ratios else "n/a")
        rows.append(cells)
    return _table([axis, *systems, *(["best fixed DoP"] if fixed else [])], rows)


def point_ratios(summaries: Sequence[Summary], axis: str, baseline: str, preset: str,
                 metric: Metric) -> list[tuple[float | None, float]]:
    """Per sweep point where both ran, in the order of the sweep: the point's value of
    ``axis`` and the ratio ``baseline`` / tangram under ``preset`` (the mean of each seed's
    ratio, as in the headline table)."""
    chosen = [s for s in summaries if s.costs == preset]
    found = []
    for point in axis_values([s.point for s in chosen], axis):
        by = by_seed([s for s in chosen if axis_value(s.point, axis) == point])
        ratios = [r for r in seed_ratios(by.get((baseline, preset)), by.get((REFERENCE, preset)),
                                         metric) if not math.isnan(r)]
        if ratios:
            found.append((point, statistics.fmean(ratios)))
    return found


def sweep_range(summaries: Sequence[Summary], axis: str, baseline: str, preset: str,
                metric: Metric) -> tuple[float, float] | None:
    """The least and the greatest, over the sweep's points, of the ratio ``baseline`` /
    tangram under ``preset`` (:func:`point_ratios`); None with fewer than two points where
    both ran."""
    means = [r for _, r in point_ratios(summaries, axis, baseline, preset, metric)]
    return (min(means), max(means)) if len(means) >= 2 else None


def span(found: tuple[float, float] | None) -> str:
    """A :func:`sweep_range` as written in a table (``0.90x-1.29x``; ``n/a``: none)."""
    return "n/a" if found is None else f"{found[0]:.2f}x-{found[1]:.2f}x"


def gpu_parity(summaries: Sequence[Summary], preset: str, baseline: str = "static") -> str:
    """The fewest GPUs at which tangram's mean ACT is at most the baseline's on the most GPUs
    swept (the paper's "same ACT with 29% of the GPUs")."""
    chosen = [s for s in summaries if s.costs == preset]
    static = [s for s in chosen if s.system == baseline]
    mine = sorted((s for s in chosen if s.system == REFERENCE),
                  key=lambda s: float(s.point["gpus"]))  # type: ignore[arg-type]
    if not static or not mine:
        return f"GPU parity: needs both tangram and {baseline} in the sweep."
    top = max(static, key=lambda s: float(s.point["gpus"]))  # type: ignore[arg-type]
    full = float(top.point["gpus"])  # type: ignore[arg-type]
    equal = next((s for s in mine if s.mean_act <= top.mean_act), None)
    if equal is None:
        best = min(mine, key=lambda s: s.mean_act)
        return (f"GPU parity ({preset}): tangram's mean ACT stays above {baseline}'s "
                f"{top.mean_act:.2f} s on {full:.0f} GPUs at every swept count (its best: "
                f"{best.mean_act:.2f} s on {best.point['gpus']} GPUs); paper: equal ACT with "
                "at most 29% of the GPUs.")
    gpus = float(equal.point["gpus"])  # type: ignore[arg-type]
    return (f"GPU parity ({preset}): tangram reaches {baseline}'s mean ACT on {full:.0f} GPUs "
            f"({top.mean_act:.2f} s) with {gpus:.0f} GPUs ({gpus / full:.0%} of them; "
            "paper: at most 29%).")
