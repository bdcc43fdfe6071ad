"""The robustness grid against the targets of malleable test runs (issue 32).

Per grid point, over its seeds, for one system (``tangram:malleable`` by default): external
time per trajectory of the best fixed DoP of {1, 2, 4, 8, 16, 32} at that point over the
system's (target >= 1 at every point, median >= 1.05), the same ratio in RL step time (the
best fixed DoP by step time; target >= 1), exec actions' ACT of static over the system's
(target >= 1: never slower), and the core-seconds each held (no target). Step time at the
largest batch against the no-queue step bound (every action at its largest count, nothing
waiting: the longest trajectory's think and action time) is shown beside it (target <= 1.05
at batch 1280 on 1280 cores). A ratio that misses its target is marked ``(miss)``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tangram_bench.grid import BOUND, FIXED, MALLEABLE, STATIC, GridPoint, Measured, Spread

MEDIAN_TARGET = 1.05
STEP_BOUND_TARGET = 1.05


@dataclass(frozen=True)
class TargetRow:
    """One point over its seeds, for one system."""

    point: GridPoint
    system: str
    external: Spread
    best_fixed: str
    vs_fixed: Spread
    best_step: str
    step_vs_fixed: Spread
    exec_vs_static: Spread
    step_vs_bound: Spread
    core_s: Spread
    core_s_fixed: Spread
    dop: tuple[int, int, int]

    @property
    def misses(self) -> list[str]:
        """The targets this point misses."""
        found = []
        if self.vs_fixed.mean < 1.0:
            found.append("external time")
        if self.step_vs_fixed.mean < 1.0:
            found.append("step time")
        if self.exec_vs_static.mean < 1.0:
            found.append("exec ACT")
        return found


def _best(runs: Sequence[Mapping[str, Measured]], key: str) -> str:
    return min(FIXED, key=lambda name: statistics.fmean(
        getattr(r[name], key) for r in runs))


def target_row(point: GridPoint, runs: Sequence[Mapping[str, Measured]],
               system: str = MALLEABLE) -> TargetRow:
    """A point's row from its seeds' runs."""
    best = _best(runs, "external")
    step = _best(runs, "step")
    return TargetRow(
        point, system,
        Spread.of([r[system].external for r in runs]),
        best,
        Spread.of([r[best].external / r[system].external for r in runs]),
        step,
        Spread.of([r[step].step / r[system].step for r in runs]),
        Spread.of([r[STATIC].exec / r[system].exec for r in runs]),
        Spread.of([r[system].step / r[BOUND].step for r in runs]),
        Spread.of([r[system].core_s for r in runs]),
        Spread.of([r[best].core_s for r in runs]),
        runs[0][system].dop,
    )


def _mark(spread: Spread, met: bool) -> str:
    return spread.cell(3, "x") + ("" if met else " (miss)")


def render(rows: Sequence[TargetRow]) -> str:
    """The rows as Markdown, misses marked."""
    system = rows[0].system if rows else MALLEABLE
    head = ["reward median, turns, parallel, batch", f"ext. {system} (s)",
            "best fixed DoP (ext.)", "best fixed / it: external time", "best fixed DoP (step)",
            "best fixed / it: step time", "exec static / it", "step / no-queue step bound",
            f"core-s {system}", "core-s best fixed (ext.)", "test DoP p10/p50/p90"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in rows:
        lines.append("| " + " | ".join([
            row.point.label, row.external.cell(), row.best_fixed,
            _mark(row.vs_fixed, row.vs_fixed.mean >= 1.0), row.best_step,
            _mark(row.step_vs_fixed, row.step_vs_fixed.mean >= 1.0),
            _mark(row.exec_vs_static, row.exec_vs_static.mean >= 1.0),
            row.step_vs_bound.cell(3, "x"), row.core_s.cell(0), row.core_s_fixed.cell(0),
            "/".join(map(str, row.dop))]) + " |")
    return "\n".join(lines)


def summary(rows: Sequence[TargetRow]) -> str:
    """How many points meet each target and every one, which miss which, the median ratio,
    and step time against the no-queue bound at batch 1280 (else the largest batch)."""
    if not rows:
        return "No point was run."
    name = rows[0].system
    short = [f"{r.point.label} ({', '.join(r.misses)})" for r in rows if r.misses]
    met = {target: sum(target not in r.misses for r in rows)
           for target in ("external time", "step time", "exec ACT")}
    median = statistics.median(r.vs_fixed.mean for r in rows)
    batch = 1280 if any(r.point.batch == 1280 for r in rows) else max(r.point.batch
                                                                      for r in rows)
    bound = [r.step_vs_bound.mean for r in rows if r.point.batch == batch]
    return (f"{name}: {len(rows) - len(short)} of {len(rows)} points meet every target; "
            f"external time >= the best fixed DoP at {met['external time']}, step time at "
            f"{met['step time']}, exec ACT <= static at {met['exec ACT']}. Median best fixed / "
            f"{name} in external time: {median:.3f}x (target >= {MEDIAN_TARGET}x"
            f"{'' if median >= MEDIAN_TARGET else ', missed'}). Step time over the no-queue "
            f"step bound at batch {batch}: {min(bound):.3f}x-{max(bound):.3f}x (target <= "
            f"{STEP_BOUND_TARGET}x at batch 1280 on 1280 cores). Short: "
            f"{'; '.join(short) or 'none'}.")
