"""Markdown tables of benchmark summaries (pure string building)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from tangram_celery.bench.summary import ALL, Summary, ratio

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


def headline_table(summaries: Sequence[Summary], costs: Sequence[str],
                   labels: dict[str, str]) -> list[str]:
    """Ratios baseline / tangram for each metric, one column per cost preset."""
    by = {(s.system, s.costs): s for s in summaries}
    baselines = sorted({s.system for s in summaries if s.system != REFERENCE},
                       key=[s.system for s in summaries].index)
    header = ["baseline", "metric", *(f"ratio: {labels.get(c, c)}" for c in costs)]
    rows = []
    for baseline in baselines:
        for name, metric in METRICS:
            cells = []
            for preset in costs:
                mine, ref = by.get((baseline, preset)), by.get((REFERENCE, preset))
                value = ratio(metric(mine), metric(ref)) if mine and ref else float("nan")
                cells.append("n/a" if math.isnan(value) else f"{value:.2f}x")
            if any(c != "n/a" for c in cells):
                rows.append([baseline, name, *cells])
    return _table(header, rows)


def comparison_table(summaries: Sequence[Summary]) -> list[str]:
    """One line per system: the headline metrics side by side (seconds)."""
    rows = [[s.system, s.costs, _num(s.external), _num(s.mean_act), _num(kind_act(s, "exec")),
             _num(reward_act(s)), _num(s.trajectory), _num(s.step), _num(s.reserved)]
            for s in summaries]
    return _table(["system", "costs", "ext. time/traj s", "mean ACT s", "exec ACT s",
                   "reward ACT s", "traj. time s", "makespan/step s", "reserved unit-s"], rows)


def sweep_table(summaries: Sequence[Summary], axis: str, preset: str) -> list[str]:
    """Per sweep point: each system's external time per trajectory and mean ACT, with the
    ratio to tangram in brackets."""
    chosen = [s for s in summaries if s.costs == preset]
    systems = list(dict.fromkeys(s.system for s in chosen))
    points = sorted({s.point[axis] for s in chosen}, key=float)  # type: ignore[arg-type]
    by = {(s.system, s.point[axis]): s for s in chosen}
    rows = []
    for point in points:
        ref = by.get((REFERENCE, point))
        cells = [str(point)]
        for system in systems:
            mine = by.get((system, point))
            if mine is None:
                cells.append("n/a")
                continue
            cell = f"{_num(mine.external)} / {_num(mine.mean_act)}"
            if ref is not None and system != REFERENCE:
                cell += f" ({ratio(mine.external, ref.external):.2f}x)"
            cells.append(cell)
        rows.append(cells)
    return _table([axis, *systems], rows)


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
