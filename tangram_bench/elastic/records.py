"""A real-stack run's records gathered into its result (pure): per-trajectory times, the
makespan, reserved unit-seconds."""

from __future__ import annotations

from collections.abc import Sequence

from tangram_bench.sim.record import ActionRecord, RunResult
from tangram_bench.workloads import Workload


def gather(result: RunResult, workload: Workload, records: Sequence[Sequence[ActionRecord]],
           cores: int) -> RunResult:
    """Fill ``result`` from each trajectory's records (in the workload's order); a trajectory's
    time runs from its first think to its last action's end."""
    for trajectory, mine in zip(workload.trajectories, records, strict=True):
        began = mine[0].submitted - trajectory.actions[0].think_s
        result.trajectory_times[trajectory.id] = mine[-1].finished - began
        result.records.extend(mine)
    result.makespan = max((r.finished for r in result.records), default=0.0)
    result.step_times = [result.makespan]
    result.reserved = sum(r.held for r in result.records)
    result.capacity["cpu"] = float(cores)
    return result
