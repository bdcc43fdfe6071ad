"""Checks every simulated run must pass; each returns the list of violations (empty: fine).

* every action of the workload finished exactly once;
* its ACT parts are non-negative and add up to its total;
* no unit was held by two actions at once (concrete unit intervals of pooled pools and static
  GPU services), and no pool's share ever exceeded its capacity (the fluid CPU of the static
  pods, the API concurrency caps).
"""

from __future__ import annotations

import itertools
from collections import defaultdict

from tangram_bench.sim.record import RunResult
from tangram_bench.workloads.model import Workload

TOLERANCE = 1e-6


def incomplete(workload: Workload, result: RunResult) -> list[str]:
    """Actions missing from, or repeated in, the result."""
    seen: dict[tuple[str, int], int] = defaultdict(int)
    for record in result.records:
        seen[(record.trajectory, record.index)] += 1
    problems = [f"{key} finished {count} times" for key, count in seen.items() if count != 1]
    for trajectory in workload.trajectories:
        for index in range(len(trajectory.actions)):
            if (trajectory.id, index) not in seen:
                problems.append(f"{(trajectory.id, index)} never finished")
    return problems


def parts_mismatch(result: RunResult) -> list[str]:
    """Records whose queue + exec + overhead differ from their total, or have a negative part."""
    problems = []
    for r in result.records:
        parts = (r.queue, r.exec, r.overhead)
        if min(parts) < -TOLERANCE or abs(sum(parts) - r.total) > TOLERANCE * max(1.0, r.total):
            problems.append(f"{r.trajectory}#{r.index}: parts {parts} vs total {r.total}")
    return problems


def over_allocated(result: RunResult) -> list[str]:
    """Units held by two actions at the same time, or shares above capacity."""
    intervals: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for allocation in result.allocations:
        for unit in allocation.units:
            intervals[(allocation.pool, unit)].append((allocation.start, allocation.end))
    problems = []
    for (pool, unit), spans in intervals.items():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            if start < end - TOLERANCE:
                problems.append(f"{pool} unit {unit} held twice around t={start:.6f}")
    for pool, share in result.peak_share.items():
        if share > 1.0 + TOLERANCE:
            problems.append(f"{pool} peaked at {share:.6f} of its capacity")
    return problems


def violations(workload: Workload, result: RunResult) -> list[str]:
    """All checks together."""
    return incomplete(workload, result) + parts_mismatch(result) + over_allocated(result)
