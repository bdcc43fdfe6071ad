"""ACT summaries: per-kind statistics of queue, exec and overhead, and their text table."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tangram_celery.action import ActionResult

PARTS = ("queue", "exec", "overhead", "total")


@dataclass(frozen=True)
class KindStats:
    """Mean and p50 of each ACT part for one action kind, in seconds."""

    kind: str
    count: int
    ok: int
    mean: dict[str, float]
    p50: dict[str, float]


def summarize(results: Iterable[ActionResult]) -> list[KindStats]:
    """Group results by kind (plus an ``all`` row) and compute their ACT statistics."""
    by_kind: dict[str, list[ActionResult]] = {}
    for result in results:
        by_kind.setdefault(result.kind, []).append(result)
    rows = [_stats(kind, group) for kind, group in sorted(by_kind.items())]
    everything = [r for group in by_kind.values() for r in group]
    if len(by_kind) > 1:
        rows.append(_stats("all", everything))
    return rows


def _stats(kind: str, group: Sequence[ActionResult]) -> KindStats:
    acts = [r.act for r in group]
    return KindStats(
        kind=kind,
        count=len(group),
        ok=sum(r.ok for r in group),
        mean={p: statistics.fmean(a[p] for a in acts) for p in PARTS},
        p50={p: statistics.median(a[p] for a in acts) for p in PARTS},
    )


def act_table(rows: Sequence[KindStats]) -> str:
    """A fixed-width table of ACT parts in milliseconds (mean, with p50 in brackets)."""
    header = f"{'kind':<10}{'n':>5}{'ok':>5}" + "".join(f"{p + ' ms':>22}" for p in PARTS)
    lines = [header, "-" * len(header)]
    for row in rows:
        cells = "".join(
            f"{row.mean[p] * 1000:>12.1f} ({row.p50[p] * 1000:>6.1f})" for p in PARTS
        )
        lines.append(f"{row.kind:<10}{row.count:>5}{row.ok:>5}{cells}")
    lines.append("mean (p50) per action; ACT = queue + exec + overhead")
    return "\n".join(lines)
