"""The driver of a real MOPD run: one system on a fresh stack, the static replicas warmed up, the
RL steps in turn, the result filled from what the calls returned."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tangram_bench.mopd_real.actions import (
    PoolLayout,
    check_emulation,
    layout,
    parallel_fractions,
    record_of,
    teacher_action,
)
from tangram_bench.mopd_real.config import POOL, RealGpuConfig
from tangram_bench.mopd_real.measured import RealGpuRun
from tangram_bench.mopd_real.stack import (
    TritonCrashed,
    Watch,
    log_events,
    pool_decisions,
    pool_workers,
    server_args,
    worker_env,
    worker_errors,
)
from tangram_bench.sim.record import Allocation
from tangram_bench.teachers.model import execute_seconds, restore_seconds
from tangram_bench.teachers.repository import write_repository
from tangram_bench.workloads import Workload
from tangram_bench.workloads.model import Trajectory
from tangram_celery.action import Action, ActionResult
from tangram_celery.client import TangramClient
from tangram_celery.pools.gpu_pool import reward_action
from tangram_celery.reward.server import TritonServer
from tangram_celery.settings import Settings
from tangram_celery.stack.broker import embedded_redis

ACTION_TIMEOUT_S = 900.0
MAX_ATTEMPTS = 3
WARMUP_S = 0.3
WARMUP_ROUNDS = 5


async def _call(client: TangramClient, action: Action) -> ActionResult:
    return await client.submit(action).aresult(ACTION_TIMEOUT_S)


def warmup_calls(pool: PoolLayout, workload: Workload, time_scale: float, attempt: int,
                 count: int) -> list[Action]:
    """``count`` warm-up calls of a static pool's teacher at its smallest parallelism, each
    holding its chunk for :data:`WARMUP_S` after its load. They state no duration (the
    ``t1`` in their inputs is the emulated teacher's work), as the timed run's calls."""
    service = workload.service(pool.service)
    size = service.dops[0]
    parallel = parallel_fractions(workload)[service.name]
    t1 = WARMUP_S / execute_seconds(1.0, parallel, size, time_scale)
    return [reward_action(f"warmup-{pool.name}-{attempt}-{i}", service.name, {"t1": t1},
                          gpu=size, pool=pool.name) for i in range(count)]


async def warm_up(client: TangramClient, pools: Sequence[PoolLayout], workload: Workload,
                  time_scale: float) -> int:
    """Load every static replica before the timed run: per pool, one call per replica at once
    (:func:`warmup_calls`, so they overlap and the pool spreads them over its replicas), again
    until every replica chunk has served one; returns the loads."""
    loads = 0
    for pool in pools:
        size = workload.service(pool.service).dops[0]
        chunks = {pool.gpu_ids[i:i + size] for i in range(0, len(pool.gpu_ids), size)}
        seen: set[tuple[int, ...]] = set()
        for attempt in range(WARMUP_ROUNDS):
            calls = warmup_calls(pool, workload, time_scale, attempt, len(chunks))
            results = await asyncio.gather(*(_call(client, a) for a in calls))
            failed = [r for r in results if not r.ok]
            if failed:
                raise RuntimeError(f"warm-up of {pool.name} failed: {failed[0].error}")
            loads += sum(bool(r.output.get("loaded")) for r in results)
            seen |= {tuple(r.units) for r in results}
            if chunks <= seen:
                break
        else:
            raise RuntimeError(f"warm-up of {pool.name}: replicas {sorted(chunks - seen)} "
                               f"never served a call in {WARMUP_ROUNDS} rounds")
    return loads


async def run_steps(client: TangramClient, workload: Workload,
                    actions: Mapping[str, Action], tick: Callable[[int], None] | None = None,
                    ) -> tuple[dict[str, ActionResult], list[float], dict[str, float]]:
    """Every RL step in turn, its samples concurrently (think, then the teacher call), the next
    step once the last call of this one is done, as the simulator's engine runs them. Returns
    the results, each step's duration and each trajectory's start (``time.time()``)."""
    results: dict[str, ActionResult] = {}
    began: dict[str, float] = {}
    steps: list[float] = []

    async def sample(trajectory: Trajectory, start: float) -> None:
        await asyncio.sleep(max(0.0, start + trajectory.start_s - time.time()))
        began[trajectory.id] = time.time()
        await asyncio.sleep(trajectory.actions[0].think_s)
        results[trajectory.id] = await _call(client, actions[trajectory.id])
        if tick is not None:
            tick(len(results))

    for step in sorted({t.step for t in workload.trajectories}):
        start = time.time()
        await asyncio.gather(*(sample(t, start) for t in workload.trajectories
                               if t.step == step))
        steps.append(time.time() - start)
        await asyncio.sleep(workload.step_gap_s)
    return results, steps, began


def run_real(workload: Workload, system: str, config: RealGpuConfig,
             point: dict[str, object] | None = None,
             tick: Callable[[int], None] | None = None,
             attempts: int = MAX_ATTEMPTS, unload_wait_s: float = 0.0) -> RealGpuRun:
    """Run ``workload`` under ``system`` on a fresh real stack: a private Redis, a private
    ``tritonserver`` on a temporary repository of emulated teachers, the system's GPU pool
    workers; stop all of it afterwards. When the server aborts (its python backend does, now
    and then, under load: ``boost::interprocess::lock_exception``, triton-inference-server/
    server#8882) the run starts again from scratch, at most ``attempts`` times in all; the
    result counts the aborts. Raises RuntimeError when an action fails or the teacher did
    not emulate the chunk it was given. With ``unload_wait_s``, the result also counts the
    unloads Triton logged once the workers stopped (each unloads its idle services), waiting
    up to that long for them."""
    crashes: list[str] = []
    for _ in range(attempts):
        try:
            result = _run_once(workload, system, config, point, tick, unload_wait_s)
        except TritonCrashed as exc:
            crashes.append(str(exc))
            continue
        result.triton_crashes = len(crashes)
        return result
    raise RuntimeError(f"tritonserver aborted in each of {attempts} runs of {system}; the "
                       f"last time:\n{crashes[-1]}")


def _run_once(workload: Workload, system: str, config: RealGpuConfig,
              point: dict[str, object] | None, tick: Callable[[int], None] | None,
              unload_wait_s: float) -> RealGpuRun:
    pools = layout(workload, system, config)
    tag = f"{system.replace(':', '-')}-{int(time.time() * 1000) % 10**9}"
    result = RealGpuRun(system, workload.name, dict(point or {}))
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tangram-mopd-")))
        repository = write_repository(work / "teachers", workload.services,
                                      parallel_fractions(workload), config.physics)
        redis_server = stack.enter_context(embedded_redis())
        settings = Settings.from_env().with_(redis_url=redis_server.url, result_url="")
        watch = Watch()
        stack.callback(watch.kill)
        triton = watch.attach(stack.enter_context(TritonServer(
            repository, workdir=work / "triton", exit_timeout_s=3,
            extra_args=server_args(config))))
        if unload_wait_s > 0:
            stack.callback(_count_unloads, triton, result, unload_wait_s)
        env = worker_env(settings, triton, repository, pools[0].scheduler,
                         config.restore_prior_s(workload.services))
        per_step = max((sum(t.step == s for t in workload.trajectories)
                        for s in {t.step for t in workload.trajectories}), default=0)
        try:
            stack.enter_context(pool_workers(settings, env, pools, per_step, work))
            client = stack.enter_context(TangramClient(settings))
            if system == "static":
                result.warmup_loads = asyncio.run(watch.guard(
                    warm_up(client, pools, workload, config.time_scale)))
            before = tuple(len(events) for events in log_events(triton))
            decided = pool_decisions(settings, pools, wait=system == "static")
            actions = {t.id: teacher_action(t.actions[0], f"{tag}-{t.id}", system, workload,
                                            config.time_scale, config.durations == "oracle")
                       for t in workload.trajectories}
            origin = time.time()
            began_at = time.perf_counter()
            outcome, steps, began = asyncio.run(watch.guard(
                run_steps(client, workload, actions, tick)))
            result.wall_s = time.perf_counter() - began_at
            calls, seconds = pool_decisions(settings, pools)
            result.decide_calls, result.decide_s = calls - decided[0], seconds - decided[1]
            loaded, unloaded = log_events(triton)
            result.triton_loads = len(loaded) - before[0]
            result.triton_unloads = len(unloaded) - before[1]
        except TritonCrashed:
            raise
        except Exception as exc:
            raise RuntimeError(f"the real MOPD run of {system} failed: {exc}\n"
                               f"{worker_errors(work)}") from exc
    _fill(result, workload, outcome, steps, began, origin, pools, config)
    return result


def _count_unloads(triton: TritonServer, result: RealGpuRun, wait_s: float) -> None:
    """After the workers stopped: how many unloads Triton logged. It logs each once every
    stub of the model has exited, one after another (about a second per simulated GPU here),
    so wait up to ``wait_s`` for as many as it loaded."""
    deadline = time.monotonic() + wait_s
    while triton.running():
        loaded, unloaded = log_events(triton)
        if len(unloaded) >= len(loaded) or time.monotonic() > deadline:
            result.unloads_after_stop = len(unloaded)
            return
        time.sleep(0.2)


def _fill(result: RealGpuRun, workload: Workload, outcome: Mapping[str, ActionResult],
          steps: list[float], began: Mapping[str, float], origin: float,
          pools: Sequence[PoolLayout], config: RealGpuConfig) -> None:
    failed = [r for r in outcome.values() if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} teacher calls failed on the real stack, e.g. "
                           f"{failed[0].action_id}: {failed[0].status} {failed[0].error}")
    problems = [p for t in workload.trajectories
                if (p := check_emulation(outcome[t.id], t.actions[0], config.time_scale))]
    if problems:
        raise RuntimeError(f"{len(problems)} calls did not emulate their chunk: {problems[:3]}")
    pool_of = {p.service: p.name for p in pools}
    for trajectory in workload.trajectories:
        spec, done = trajectory.actions[0], outcome[trajectory.id]
        record = record_of(done, spec, trajectory.id, pool_of.get(spec.service, POOL), origin)
        result.records.append(record)
        result.allocations.append(Allocation(
            "gpu", tuple(done.units), done.timings.admitted - origin,
            done.timings.exec_finished - origin))
        result.trajectory_times[trajectory.id] = record.finished - (began[trajectory.id]
                                                                   - origin)
        if record.loaded:
            service = workload.service(spec.service)
            result.restores.append((record.units, done.timings.setup_s, restore_seconds(
                config.load_init_s, service.weights_gb, config.restore_gbps, record.units,
                config.time_scale)))
    result.step_times = list(steps)
    result.makespan = max((r.finished for r in result.records), default=0.0)
    result.capacity["gpu"] = float(config.gpus)
    if result.system == "static":
        layout_gpus = sum(len(p.gpu_ids) for p in pools)
        result.reserved = layout_gpus * result.makespan
    else:
        result.reserved = sum(r.held for r in result.records)
