"""Statistics of a run: ACT percentiles and parts per action kind, per-trajectory and pool
totals. Pure functions over :class:`~tangram_bench.sim.record.RunResult`, shared by the
simulated and the real-stack modes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tangram_bench.sim.record import ActionRecord, RunResult

KIND_ORDER = ("exec", "test_run", "api", "reward")
UNIT_POOLS = ("cpu", "gpu")
"""Pools whose unit-seconds the reserved and used totals count (API calls hold no units)."""
ALL = "all"


@dataclass(frozen=True)
class KindStats:
    """ACT statistics of one action kind (or ``all``), seconds; shares of the mean ACT."""

    kind: str
    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    queue: float
    exec: float
    overhead: float
    loads: int = 0

    @property
    def shares(self) -> tuple[float, float, float]:
        """Queue, exec and overhead as fractions of the mean ACT."""
        if self.mean <= 0:
            return (0.0, 0.0, 0.0)
        return (self.queue / self.mean, self.exec / self.mean, self.overhead / self.mean)


@dataclass(frozen=True)
class Summary:
    """One run of one system, summarised."""

    system: str
    costs: str
    point: dict[str, object]
    kinds: tuple[KindStats, ...]
    external: float
    trajectory: float
    makespan: float
    step: float
    reserved: float
    used: float
    decide_calls: int
    decide_ms: float
    sched_share: float
    extra: dict[str, float] = field(default_factory=dict)
    seed: int = 0
    """The workload's seed (runs of one system, preset and point differ only in it)."""

    def kind(self, name: str) -> KindStats | None:
        """The statistics of one kind (``all`` for every action), if it occurred."""
        return next((k for k in self.kinds if k.kind == name), None)

    @property
    def mean_act(self) -> float:
        """Mean ACT over every action."""
        stats = self.kind(ALL)
        return stats.mean if stats else 0.0


def kind_stats(kind: str, records: Sequence[ActionRecord]) -> KindStats:
    """Statistics of ``records`` labelled ``kind``."""
    totals = np.array([r.total for r in records])
    p50, p90, p99 = np.percentile(totals, [50, 90, 99]).tolist()
    return KindStats(
        kind=kind, count=len(records), mean=float(totals.mean()), p50=p50, p90=p90, p99=p99,
        queue=float(np.mean([r.queue for r in records])),
        exec=float(np.mean([r.exec for r in records])),
        overhead=float(np.mean([r.overhead for r in records])),
        loads=sum(r.loaded for r in records),
    )


def external_times(records: Sequence[ActionRecord]) -> dict[str, float]:
    """Per trajectory, the sum of its actions' ACTs (its time spent outside the LLM)."""
    external: dict[str, float] = defaultdict(float)
    for record in records:
        external[record.trajectory] += record.total
    return external


def summarize(result: RunResult, costs: str) -> Summary:
    """Summarise one run (``costs`` labels its cost preset)."""
    by_kind: dict[str, list[ActionRecord]] = defaultdict(list)
    for record in result.records:
        by_kind[record.kind].append(record)
    ordered = sorted(by_kind, key=lambda k: (KIND_ORDER.index(k) if k in KIND_ORDER else 9, k))
    kinds = [kind_stats(k, by_kind[k]) for k in ordered]
    if result.records:
        kinds.append(kind_stats(ALL, result.records))
    external = external_times(result.records)
    admitted = [r.sched_s for r in result.records]
    mean_act = kinds[-1].mean if kinds else 0.0
    sched = float(np.mean(admitted)) if admitted else 0.0
    return Summary(
        system=result.system, costs=costs, point=dict(result.point), kinds=tuple(kinds),
        external=float(np.mean(list(external.values()))) if external else 0.0,
        trajectory=(float(np.mean(list(result.trajectory_times.values())))
                    if result.trajectory_times else 0.0),
        makespan=result.makespan,
        step=float(np.mean(result.step_times)) if result.step_times else result.makespan,
        reserved=result.reserved,
        used=float(sum(r.used for r in result.records if r.pool in UNIT_POOLS)),
        decide_calls=result.decide_calls,
        decide_ms=1000 * result.decide_s / result.decide_calls if result.decide_calls else 0.0,
        sched_share=sched / mean_act if mean_act > 0 else 0.0, seed=result.seed,
    )


def ratio(baseline: float, tangram: float) -> float:
    """``baseline / tangram`` (> 1: tangram is faster); NaN when undefined."""
    return baseline / tangram if tangram > 0 else float("nan")


def from_json(rows: Sequence[dict[str, Any]]) -> list[Summary]:
    """Summaries from the JSON ``tangram bench`` writes beside a section (``<name>.json``)."""
    return [Summary(**{**row, "kinds": tuple(KindStats(**k) for k in row["kinds"])})
            for row in rows]
