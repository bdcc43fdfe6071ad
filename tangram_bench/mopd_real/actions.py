"""What a real MOPD run submits and reads back (pure): the scaled workload, each system's GPU
pools, each teacher call as an action, as a benchmark record, and the check of its emulation."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from tangram_bench.mopd_real.config import (
    CACHE,
    DEFAULT_THINK_SCALE,
    DEFAULT_TIME_SCALE,
    POOL,
    SYSTEMS,
    WORKERS,
    RealGpuConfig,
)
from tangram_bench.sim.record import ActionRecord
from tangram_bench.sim.services import replica_chunks
from tangram_bench.teachers.model import execute_seconds
from tangram_bench.workloads import MopdParams, Workload, mopd
from tangram_bench.workloads.model import ActionSpec, Trajectory
from tangram_celery.action import Action, ActionResult
from tangram_celery.pools.gpu_pool import reward_action
from tangram_celery.settings import Settings


@dataclass(frozen=True)
class PoolLayout:
    """One GPU pool worker of a system: its name, GPU ids, node size and scheduler, whether it
    runs ``--cache-aware``."""

    name: str
    gpu_ids: tuple[int, ...]
    node_size: int
    scheduler: str
    service: str = ""
    cache_aware: bool = False


def scale_workload(workload: Workload, time_scale: float, think_scale: float = 1.0) -> Workload:
    """``workload`` with every duration times ``time_scale``, and the LLM's side (think times,
    start offsets, step gaps) times ``think_scale`` on top."""
    llm = time_scale * think_scale

    def action(spec: ActionSpec) -> ActionSpec:
        return replace(spec, t1=spec.t1 * time_scale, think_s=spec.think_s * llm)

    trajectories = tuple(
        Trajectory(t.id, tuple(action(a) for a in t.actions), t.start_s * llm, t.step)
        for t in workload.trajectories)
    return replace(workload, trajectories=trajectories, step_gap_s=workload.step_gap_s * llm)


def real_workload(batch: int, seed: int, time_scale: float = DEFAULT_TIME_SCALE,
                  think_scale: float = DEFAULT_THINK_SCALE,
                  params: MopdParams | None = None) -> Workload:
    """The seeded MOPD workload (``batch`` samples per step) at ``time_scale``, its
    generation (think) times also at ``think_scale``."""
    return scale_workload(mopd(batch, seed, params), time_scale, think_scale)


def parallel_fractions(workload: Workload) -> dict[str, float]:
    """Each teacher's parallel fraction, as its calls declare it (one value per teacher)."""
    found: dict[str, set[float]] = {s.name: set() for s in workload.services}
    for trajectory in workload.trajectories:
        for spec in trajectory.actions:
            if spec.pool == "gpu":
                found[spec.service].add(spec.parallel)
    mixed = sorted(name for name, values in found.items() if len(values) > 1)
    if mixed:
        raise ValueError(f"teachers {mixed} have calls of different parallel fractions")
    return {name: next(iter(values), 0.0) for name, values in found.items()}


def scheduler_for(system: str) -> str:
    """The pool workers' ``TANGRAM_SCHEDULER`` under ``system``."""
    if system not in WORKERS:
        raise ValueError(f"the real MOPD stack runs {', '.join(SYSTEMS)}, not {system!r}")
    return WORKERS[system] or Settings.from_env({}).node.scheduler


def pool_name(service: str) -> str:
    """The static system's pool of one teacher (a valid pool name)."""
    return "static-" + re.sub(r"[^A-Za-z0-9_-]", "_", service)


def layout(workload: Workload, system: str, config: RealGpuConfig) -> list[PoolLayout]:
    """The GPU pool workers ``system`` runs: one pool of every GPU (``--cache-aware`` for the
    ``:cache`` baselines), or (``static``) one pool per teacher on the GPU ids of its replicas
    (the simulator's layout)."""
    scheduler = scheduler_for(system)
    if system != "static":
        return [PoolLayout(POOL, tuple(range(config.gpus)), config.node_size, scheduler,
                           cache_aware=system.endswith(CACHE))]
    chunks = replica_chunks(workload, config.cluster())
    pools = []
    for service in workload.services:
        ordered = sorted(chunks[service.name])
        ids = tuple(gpu for chunk in ordered for gpu in chunk)
        pools.append(PoolLayout(pool_name(service.name), ids, service.dops[0], scheduler,
                                service.name))
    return pools


ELASTIC = "linear"
"""What a learned-mode call states as its elasticity: only that it may run at any of the
GPU counts it lists (without a ``t1`` the pool reads no more from it: it plans the call with
the times it learned, :func:`tangram_celery.scheduling.service_times.service_options`)."""


def gpu_count(spec: ActionSpec, system: str, workload: Workload) -> int | dict[str, list[int]]:
    """The GPUs ``system`` asks for: the teacher's smallest parallelism on a static replica;
    under ``fixed-dop-<k>[:cache]`` the largest of the call's counts up to k (the simulator's
    :class:`~tangram_bench.sim.policy.FixedDop`); else every count the call allows."""
    if system == "static":
        return workload.service(spec.service).dops[0]
    fixed = re.fullmatch(rf"fixed-dop-(\d+)(?:{CACHE})?", system)
    if fixed:
        return max((u for u in spec.units if u <= int(fixed.group(1))), default=spec.units[0])
    return {"set": list(spec.units)}


def teacher_action(spec: ActionSpec, trajectory_id: str, system: str,
                   workload: Workload, time_scale: float, oracle: bool = False) -> Action:
    """The reward call of ``spec`` as ``system`` submits it: input ``t1`` in the workload's
    unscaled seconds (what the emulated teacher works on; the teacher scales it), named by its
    teacher (the signature the pool learns under), on the GPU counts of :func:`gpu_count`
    (on the teacher's own pool for ``static``). Only with ``oracle`` does it also tell the
    scheduler its true ``t1`` in wall seconds and its Amdahl elasticity (an ablation); else an
    elastic call says only that it is (:data:`ELASTIC`) and the pool learns the rest."""
    static = system == "static"
    gpu = gpu_count(spec, system, workload)
    elastic = isinstance(gpu, dict) and len(gpu["set"]) > 1
    told: dict[str, object] = ({"t1": spec.t1, "elasticity": {"amdahl": spec.parallel}}
                               if oracle else {"elasticity": ELASTIC} if elastic else {})
    return reward_action(trajectory_id, spec.service, {"t1": spec.t1 / time_scale}, gpu=gpu,
                         pool=pool_name(spec.service) if static else POOL,
                         signature=spec.service, **told)


def record_of(result: ActionResult, spec: ActionSpec, trajectory: str, pool: str,
              origin: float) -> ActionRecord:
    """A real reward call as a benchmark record (times relative to ``origin``)."""
    t, act = result.timings, result.act
    units = len(result.units)
    submitted = t.submitted - origin
    queue, execution = act["queue"], act["exec"]
    return ActionRecord(
        trajectory=trajectory, index=0, kind=result.kind, pool="gpu", node=pool, units=units,
        submitted=submitted, started=t.admitted - origin, finished=submitted + act["total"],
        queue=queue, exec=execution, overhead=act["total"] - queue - execution,
        held=units * max(t.exec_finished - t.admitted, 0.0), used=units * execution,
        loaded=bool(result.output.get("loaded")), sched_s=t.sched_s)


def check_emulation(result: ActionResult, spec: ActionSpec, time_scale: float) -> str:
    """A problem with what the teacher emulated for ``result`` ('' if none): it must have run
    on the chunk size the scheduler granted, for its Amdahl time on that chunk."""
    dop = int(result.output.get("dop", -1))
    if dop != len(result.units):
        return f"{result.action_id}: teacher ran on {dop} GPUs, granted {list(result.units)}"
    want = execute_seconds(spec.t1 / time_scale, spec.parallel, dop, time_scale)
    slept = float(result.output.get("emulated_s", -1.0))
    if abs(slept - want) > 1e-4 + 1e-4 * want:
        return f"{result.action_id}: teacher slept {slept:.6f} s, expected {want:.6f} s"
    return ""
