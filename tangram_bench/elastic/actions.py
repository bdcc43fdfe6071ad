"""What each real-stack system submits (pure): the scaled AI-coding batch, the node scheduler,
every trajectory's emulated actions."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from tangram_bench.emulation import emulated_exec, emulated_malleable_run, emulated_test_run
from tangram_bench.workloads import CodingParams, Workload, coding
from tangram_bench.workloads.model import ActionSpec
from tangram_celery.action import Action
from tangram_celery.settings import Settings

REAL_PARAMS = CodingParams(
    turns=(2, 4), think_median_s=0.3, think_sigma=0.5, exec_median_s=0.05, exec_sigma=1.0,
    exec_range_s=(0.001, 1.0), test_median_s=2.5, test_sigma=0.5, test_range_s=(0.5, 10.0),
)
"""The AI-coding shape scaled to a laptop: fewer turns, shorter think and exec, short tests."""
TRAJECTORY_MEMORY_MB = 128.0
"""Memory each emulated trajectory reserves on its node (its actions only sleep), so that a
node's default memory holds dozens of trajectories."""


@dataclass(frozen=True)
class Step:
    """One step of a trajectory: think for ``think_s``, then run ``action``."""

    think_s: float
    action: Action


def real_workload(batch: int, seed: int, cores: int) -> Workload:
    """The seeded AI-coding batch at the real-stack scale, test runs over 1..cores."""
    return coding(batch, seed, replace(REAL_PARAMS, max_units=cores))


FIFO_ON_NODE = "fcfs-min"
"""The system that runs tangram's node worker with FIFO at one core per action (what the
``celery`` system was before it ran on a stock Celery worker)."""
WORKER_SCHEDULERS = {"robust": "robust", "ersa": "elastic"}
"""The node worker's ``TANGRAM_SCHEDULER`` for each simulator policy the real stack can run."""
MALLEABLE = "tangram:malleable"
"""The system whose node resizes running test runs (``TANGRAM_MALLEABLE_RESIZE=1``), its test
runs real pytest runs through the malleable runner (:func:`emulated_malleable_run`)."""
MALLEABLE_FIXED = "tangram:malleable-fixed"
"""The control of :data:`MALLEABLE`: the same malleable pytest runs on a node that does not
resize them (each keeps the cores it was admitted with), so the runner's own cost is told
apart from what resizing gains."""


def worker_env(system: str) -> dict[str, str]:
    """The node worker's environment for ``system``: its scheduler, and the resizing of
    malleable runs on for :data:`MALLEABLE` only (every other system keeps its test runs'
    cores, so each table row means what it says whatever the default)."""
    return {"TANGRAM_SCHEDULER": scheduler_for(system),
            "TANGRAM_MALLEABLE_RESIZE": "1" if system == MALLEABLE else "0"}


def scheduler_for(system: str) -> str:
    """The node scheduler (``TANGRAM_SCHEDULER``) a real-stack system runs with: ``tangram``
    and ``tangram:malleable[-fixed]`` the default one, ``tangram:ersa`` the paper's allocator
    (as fixed DoP does), ``fcfs-min`` FIFO at one core each. (``celery`` runs on a stock Celery
    worker, not on a node.)"""
    if system == FIFO_ON_NODE:
        return "fcfs-min"
    if system in ("tangram", MALLEABLE, MALLEABLE_FIXED):
        return Settings.from_env({}).node.scheduler
    if system.startswith("tangram:") and system.split(":", 1)[1] in WORKER_SCHEDULERS:
        return WORKER_SCHEDULERS[system.split(":", 1)[1]]
    if re.fullmatch(r"fixed-dop-\d+", system):
        return "elastic"
    raise ValueError(f"the real stack runs tangram, tangram:{{{','.join(WORKER_SCHEDULERS)}}}, "
                     f"{MALLEABLE}, {MALLEABLE_FIXED}, "
                     f"fixed-dop-<k> or {FIFO_ON_NODE} on a node, not {system!r}")


def action_for(spec: ActionSpec, trajectory_id: str, system: str, cores: int) -> Action:
    """The emulated action of ``spec`` as ``system`` submits it."""
    if spec.kind != "test_run":
        action = emulated_exec(trajectory_id, spec.t1, declare=False)
    elif system in (MALLEABLE, MALLEABLE_FIXED):
        action = emulated_malleable_run(trajectory_id, round(spec.t1, 3),
                                        round(spec.parallel, 3), cores,
                                        signature=spec.signature or "emulated-tests")
    else:
        fixed = re.fullmatch(r"fixed-dop-(\d+)", system)
        low = min(int(fixed.group(1)), cores) if fixed else 1
        high = low if fixed else cores
        action = emulated_test_run(trajectory_id, round(spec.t1, 3), round(spec.parallel, 3),
                                   high, min_units=low, declare=False,
                                   signature=spec.signature or "emulated-tests")
    return replace(action, trajectory_memory_mb=TRAJECTORY_MEMORY_MB)


def steps_for(workload: Workload, system: str, cores: int, tag: str) -> list[list[Step]]:
    """Every trajectory's steps, with ids made unique by ``tag``."""
    return [
        [Step(spec.think_s, action_for(spec, f"{tag}-{t.id}", system, cores))
         for spec in t.actions]
        for t in workload.trajectories
    ]
