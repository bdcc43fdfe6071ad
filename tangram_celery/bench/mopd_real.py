"""The MOPD-like workload on the real stack: teachers on pooled GPUs against static services.

    tangram bench mopd --mode real [--batch 48] [--gpus 24] [--time-scale 1] [--think-scale 0.1]
    (systems: tangram, tangram:ersa, celery, static; the same workload simulated beside it)

What is real: Redis, the Celery GPU pool worker processes (their admission gate and scheduler,
the GPU manager's evict-on-execution placement, its memory bookkeeping), the ``tritonserver``
binary of nvidia-pytriton loading and unloading every (teacher, chunk) service through its
repository API, and every request going through Triton. What is emulated: the GPUs (simulated
ids, 80 GB each for the manager's bookkeeping, as in the simulator) and the work on them, by
time: each teacher is :mod:`tangram_celery.bench.teachers.model`, whose load sleeps the restore
time of the chunk it was really placed on and whose requests sleep their Amdahl time on that
chunk (the simulator's formulas), so a request's duration depends on the chunk the scheduler
gave it.

The workload is the simulator's MOPD generator (:func:`~tangram_celery.workloads.mopd`)
with fewer samples per step (48, not 512), every duration multiplied by ``time_scale`` (think
times, one-GPU times, the restore physics) and the LLM's generation (think) times by
``think_scale`` on top: a tenth of the samples arriving in a tenth of the time offers the
teachers about the calls per second of the 512-sample step, and a run of one system takes
about two minutes. The GPU side stays at full length by default (``time_scale`` 1) because
the real stack's own costs do not shrink with it: a load starts one python-backend stub
process per simulated GPU of the chunk, 1-5 s for a chunk of 8 on this 2-core machine, which
would dwarf restores scaled down to 0.5-2 s. All figures are wall seconds of the run. Each
system gets a fresh Redis and a fresh Triton:

* ``tangram``: one pool of ``gpus`` GPUs (nodes of 8), ``TANGRAM_SCHEDULER`` at its default
  (``robust``: the service-aware scheduler), every call elastic over its teacher's parallelisms;
* ``tangram:ersa``: the same pool with the paper's allocator (``TANGRAM_SCHEDULER=elastic``);
* ``celery``: the same pool, ``TANGRAM_SCHEDULER=fcfs-min``: every call at its minimum, FIFO;
* ``static``: every teacher owns fixed replicas at its smallest parallelism, laid out as the
  simulator lays them out (:func:`~tangram_celery.sim.services.replica_chunks`): one GPU
  pool worker per teacher on exactly those GPU ids, each replica loaded before the timed run.

Every pool runs with cross-request batching off (``--no-batching``): the simulator models
none, and the comparison is with the simulator.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import redis

from tangram_celery import keys
from tangram_celery.action import Action, ActionResult
from tangram_celery.bench.plan import Point
from tangram_celery.bench.summary import Summary, ratio
from tangram_celery.bench.teachers.model import execute_seconds, restore_seconds
from tangram_celery.bench.teachers.repository import TeacherPhysics, write_repository
from tangram_celery.client import TangramClient
from tangram_celery.pools.gpu_pool import DEFAULT_NODE_SIZE, reward_action, worker_name
from tangram_celery.pools.launch import spawn_gpu_worker, wait_for_worker
from tangram_celery.processes import stop_process
from tangram_celery.reward.server import TritonServer
from tangram_celery.settings import Settings
from tangram_celery.sim.cluster import Cluster
from tangram_celery.sim.costs import Costs
from tangram_celery.sim.record import ActionRecord, Allocation, RunResult
from tangram_celery.sim.services import replica_chunks
from tangram_celery.stack.broker import embedded_redis
from tangram_celery.tasks.app import make_app
from tangram_celery.workloads import MopdParams, Workload, mopd
from tangram_celery.workloads.model import ActionSpec, GpuService, Trajectory

SYSTEMS = ("tangram", "tangram:ersa", "celery", "static")
DEFAULT_BATCH = 48
DEFAULT_GPUS = 24
DEFAULT_TIME_SCALE = 1.0
DEFAULT_THINK_SCALE = 0.1
POOL = "mopd"
GPU_MEMORY_MB = int(Cluster.gpu_memory_gb * 1000)
"""Memory per simulated GPU for the manager's bookkeeping, the simulator's (80 GB)."""
ACTION_TIMEOUT_S = 900.0
MAX_ATTEMPTS = 3
CRASH_POLL_S = 0.5
LOGLEVEL = "WARNING"
T = TypeVar("T")
WARMUP_S = 0.3
WARMUP_ROUNDS = 5
DISPATCH_S = 0.005
"""Per-action control-plane cost charged to the pooled systems in the simulation beside the real
run (presets ``sim`` and ``sim-measured``). The coding mode's 46 ms (``sim.costs.CONTROL_PLANE``)
includes 33 ms of bubblewrap sandbox setup that a reward action never pays; this is the median
overhead of the teacher calls that restored nothing in ``tangram bench mopd --mode real`` on
the 2-core dev machine (client validation, publish, broker, the pool worker's hand-off, the
gRPC call and the result path): 3-6 ms per system."""
SIM_COSTS = Costs(dispatch_s=DISPATCH_S)
MEASURED = "sim-measured"
"""The preset of the simulation charged the restore times the real runs measured."""
LOADED = re.compile(r"successfully loaded '([^']+)'")
UNLOADED = re.compile(r"successfully unloaded '([^']+)'")
WORKERS = {"tangram": None, "tangram:ersa": "elastic", "celery": "fcfs-min", "static": "fcfs-min"}


@dataclass(frozen=True)
class RestoreFit:
    """What a restore cost on the real stack beyond the emulated time, as ``fixed_s +
    per_gpu_s * k`` on a chunk of ``k`` (least squares over ``samples`` restores): Triton
    starts one python-backend stub process per simulated GPU of the chunk, and they compete for
    this machine's CPUs with every other load and request of the moment."""

    fixed_s: float = 0.0
    per_gpu_s: float = 0.0
    samples: int = 0

    def extra_s(self, k: int) -> float:
        """Seconds beyond the emulated restore on a chunk of ``k``."""
        return self.fixed_s + self.per_gpu_s * k


def restore_fit(results: Iterable[RunResult]) -> RestoreFit:
    """The :class:`RestoreFit` of every restore of the real runs among ``results``: the line
    through (k, measured - emulated), neither coefficient below zero."""
    points = [(k, measured - emulated) for r in results if isinstance(r, RealGpuRun)
              for k, measured, emulated in r.restores]
    if not points:
        return RestoreFit()
    ks = np.array([k for k, _ in points], dtype=float)
    ys = np.array([y for _, y in points], dtype=float)
    if len(set(ks.tolist())) > 1:
        (fixed, per_gpu), *_ = np.linalg.lstsq(np.stack([np.ones_like(ks), ks], 1), ys,
                                               rcond=None)
    else:
        fixed, per_gpu = float(ys.mean()), 0.0
    if per_gpu < 0:
        fixed, per_gpu = float(ys.mean()), 0.0
    if fixed < 0:
        fixed, per_gpu = 0.0, float((ks * ys).sum() / (ks * ks).sum())
    return RestoreFit(max(float(fixed), 0.0), max(float(per_gpu), 0.0), len(points))


@dataclass(frozen=True)
class MeasuredCluster(Cluster):
    """The simulated cluster of a real run whose restores cost what that run measured: the
    emulated restore plus :class:`RestoreFit`'s extra on each chunk size."""

    restore_fixed_s: float = 0.0
    restore_per_gpu_s: float = 0.0

    def load_s(self, service: GpuService, dop: int) -> float:
        """The emulated restore plus the measured extra."""
        return super().load_s(service, dop) + self.restore_fixed_s + self.restore_per_gpu_s * dop


@dataclass(frozen=True)
class RealGpuConfig:
    """The emulated hardware of a real run: ``gpus`` simulated GPUs in nodes of ``node_size``,
    the restore physics (the simulator's flags, in the workload's unscaled seconds) and the
    time scale applied to every duration."""

    gpus: int = DEFAULT_GPUS
    time_scale: float = DEFAULT_TIME_SCALE
    think_scale: float = DEFAULT_THINK_SCALE
    load_init_s: float = Cluster.load_init_s
    restore_gbps: float = Cluster.restore_gbps
    node_size: int = DEFAULT_NODE_SIZE

    def __post_init__(self) -> None:
        if self.gpus < 1 or self.gpus % self.node_size:
            raise ValueError(f"--gpus {self.gpus}: use a multiple of {self.node_size}")
        if not self.time_scale > 0 or not self.think_scale > 0:
            raise ValueError("--time-scale and --think-scale must be positive")

    @property
    def physics(self) -> TeacherPhysics:
        """What the emulated teachers read from their configs."""
        return TeacherPhysics(self.load_init_s, self.restore_gbps, self.time_scale)

    def cluster(self, fit: RestoreFit | None = None) -> Cluster:
        """The simulated cluster of the same run: the same GPUs and memory, the restore
        physics at the time scale (so :meth:`Cluster.load_s` is the teachers' restore); with
        ``fit``, each restore also costs what the real stack measured beyond that."""
        return MeasuredCluster(
            cpu_nodes=1, cores_per_node=8, numa_per_node=1,
            gpu_nodes=self.gpus // self.node_size, gpus_per_node=self.node_size,
            load_init_s=self.load_init_s * self.time_scale,
            restore_gbps=self.restore_gbps / self.time_scale,
            restore_fixed_s=fit.fixed_s if fit else 0.0,
            restore_per_gpu_s=fit.per_gpu_s if fit else 0.0)

    def restore_prior_s(self, services: Sequence[GpuService]) -> float:
        """``TANGRAM_GPU_RESTORE_S`` of the pool (its restore estimate until it has measured
        one): the mean restore of the teachers at their smallest parallelism."""
        restores = [restore_seconds(self.load_init_s, s.weights_gb, self.restore_gbps,
                                    s.dops[0], self.time_scale) for s in services]
        return sum(restores) / len(restores) if restores else 0.0


@dataclass
class RealGpuRun(RunResult):
    """A real run's records plus what Triton itself did (counted in its log) and what each
    restore cost against what the teacher emulated."""

    triton_loads: int = 0
    triton_unloads: int = 0
    warmup_loads: int = 0
    triton_crashes: int = 0
    """Runs of this system started again from scratch because tritonserver aborted."""
    unloads_after_stop: int = 0
    """Every unload in Triton's log once the workers stopped (each unloads its idle services);
    counted only when asked (``run_real(unload_wait_s=...)``)."""
    restores: list[tuple[int, float, float]] = field(default_factory=list)
    """(chunk size, measured set-up seconds, emulated restore seconds) of each call that
    restored its teacher."""


@dataclass(frozen=True)
class PoolLayout:
    """One GPU pool worker of a system: its name, GPU ids, node size and scheduler."""

    name: str
    gpu_ids: tuple[int, ...]
    node_size: int
    scheduler: str
    service: str = ""


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
    return WORKERS[system] or Settings.from_env({}).scheduler


def pool_name(service: str) -> str:
    """The static system's pool of one teacher (a valid pool name)."""
    return "static-" + re.sub(r"[^A-Za-z0-9_-]", "_", service)


def layout(workload: Workload, system: str, config: RealGpuConfig) -> list[PoolLayout]:
    """The GPU pool workers ``system`` runs: one pool of every GPU, or (``static``) one pool per
    teacher on the GPU ids of its replicas (the simulator's layout)."""
    scheduler = scheduler_for(system)
    if system != "static":
        return [PoolLayout(POOL, tuple(range(config.gpus)), config.node_size, scheduler)]
    chunks = replica_chunks(workload, config.cluster())
    pools = []
    for service in workload.services:
        ordered = sorted(chunks[service.name])
        ids = tuple(gpu for chunk in ordered for gpu in chunk)
        pools.append(PoolLayout(pool_name(service.name), ids, service.dops[0], scheduler,
                                service.name))
    return pools


def teacher_action(spec: ActionSpec, trajectory_id: str, system: str,
                   workload: Workload, time_scale: float) -> Action:
    """The reward call of ``spec`` as ``system`` submits it: input ``t1`` in the workload's
    unscaled seconds (the teacher scales it), the action's own ``t1`` and Amdahl elasticity
    in wall seconds for the scheduler; elastic over the teacher's parallelisms, except on a
    static replica (its smallest parallelism, on the teacher's own pool)."""
    service = workload.service(spec.service)
    static = system == "static"
    gpu: int | dict[str, list[int]] = (service.dops[0] if static
                                       else {"set": list(spec.units)})
    return reward_action(trajectory_id, spec.service, {"t1": spec.t1 / time_scale}, gpu=gpu,
                         pool=pool_name(spec.service) if static else POOL, t1=spec.t1,
                         elasticity={"amdahl": spec.parallel}, signature=spec.service)


def server_args(config: RealGpuConfig) -> list[str]:
    """The run's extra ``tritonserver`` flags: as many model-load threads as GPUs. Triton loads
    at most ``--model-load-thread-count`` models at once (default 4) and queues the rest;
    evict-on-execution may restore a service on every GPU at the same moment (8 concurrent
    1-instance loads: 4.7 s with the default, 2.4 s with 16 threads, measured here)."""
    return [f"--model-load-thread-count={max(4, config.gpus)}"]


def worker_env(settings: Settings, triton: TritonServer, repository: Path, scheduler: str,
               restore_prior_s: float) -> dict[str, str]:
    """The ``TANGRAM_`` environment of the run's GPU pool workers. They talk to Triton over
    gRPC: a load over HTTP holds one of Triton's HTTP worker threads for the whole load and
    stalls the inference requests that thread serves (1.3-1.5 s per 8-instance load measured
    here; triton-inference-server/server#8958, fix pending in #8737), and evict-on-execution
    loads often."""
    return {
        "TANGRAM_REDIS_URL": settings.redis_url,
        "TANGRAM_TRITON_URL": triton.grpc_url,
        "TANGRAM_TRITON_PROTOCOL": "grpc",
        "TANGRAM_TRITON_REPOSITORY": str(repository),
        "TANGRAM_SCHEDULER": scheduler,
        "TANGRAM_GPU_SIMULATED": "true",
        "TANGRAM_GPU_MEMORY_MB": str(GPU_MEMORY_MB),
        "TANGRAM_GPU_RESTORE_S": f"{restore_prior_s:.6f}",
    }


@contextlib.contextmanager
def pool_workers(settings: Settings, env: Mapping[str, str], pools: Sequence[PoolLayout],
                 window: int, logs: Path) -> Iterator[list[str]]:
    """Start one GPU pool worker per layout (batching off); yields their Celery names; stops
    them (SIGTERM: each unloads its idle services) when done."""
    app = make_app(settings)
    started = []
    try:
        names = []
        for pool in pools:
            args = ["--node-size", str(pool.node_size), "--no-batching",
                    "--gpu-ids", ",".join(str(g) for g in pool.gpu_ids),
                    "--concurrency", str(max(window, 2 * len(pool.gpu_ids))),
                    "--loglevel", LOGLEVEL]
            env_of = {**env, "TANGRAM_SCHEDULER": pool.scheduler}
            process = spawn_gpu_worker(env_of, pool.name, len(pool.gpu_ids),
                                       logs / f"{pool.name}.log", args)
            started.append(process)
            names.append(worker_name(pool.name, process.pid))
        for name, process in zip(names, started, strict=True):
            wait_for_worker(app, name, process, timeout=120)
        yield names
    finally:
        for process in started:
            stop_process(process, timeout=30)
        app.close()


def pool_decisions(settings: Settings, pools: Sequence[PoolLayout],
                   wait: bool = True) -> tuple[int, float]:
    """The scheduler calls and wall seconds the ``pools`` published, summed; after one more
    heartbeat with ``wait`` (so that their last decisions are counted)."""
    if wait:
        time.sleep(settings.node_heartbeat_s + 0.5)
    client = redis.Redis.from_url(settings.redis_url)
    try:
        calls, seconds = 0, 0.0
        for pool in pools:
            raw = client.hmget(keys.gpu_pool(pool.name), ["decide_calls", "decide_s"])
            calls += int(raw[0] or 0)
            seconds += float(raw[1] or 0.0)
        return calls, seconds
    finally:
        client.close()


def log_events(server: TritonServer) -> tuple[list[str], list[str]]:
    """The names Triton reports it loaded and unloaded so far (its log)."""
    try:
        text = server.log_path.read_text(errors="replace")
    except OSError:
        return [], []
    return LOADED.findall(text), UNLOADED.findall(text)


async def _call(client: TangramClient, action: Action) -> ActionResult:
    return await client.submit(action).aresult(ACTION_TIMEOUT_S)


async def warm_up(client: TangramClient, pools: Sequence[PoolLayout], workload: Workload,
                  time_scale: float) -> int:
    """Load every static replica before the timed run: per pool, one call per replica at once
    (each holding its chunk for :data:`WARMUP_S` after its load, so they overlap and the pool
    spreads them over its replicas), again until every replica chunk has served one; returns
    the loads."""
    parallel = parallel_fractions(workload)
    loads = 0
    for pool in pools:
        service = workload.service(pool.service)
        size = service.dops[0]
        t1 = WARMUP_S / execute_seconds(1.0, parallel[service.name], size, time_scale)
        chunks = {pool.gpu_ids[i:i + size] for i in range(0, len(pool.gpu_ids), size)}
        seen: set[tuple[int, ...]] = set()
        for attempt in range(WARMUP_ROUNDS):
            calls = [reward_action(f"warmup-{pool.name}-{attempt}-{i}", service.name,
                                   {"t1": t1}, gpu=size, pool=pool.name, t1=t1 * time_scale)
                     for i in range(len(chunks))]
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


class TritonCrashed(RuntimeError):
    """The run's tritonserver exited while the run needed it."""


class Watch:
    """Runs a coroutine while watching a run's ``tritonserver``: when the server dies, its
    process group (the python-backend stubs, which hold the workers' connections open) is
    killed and :class:`TritonCrashed` raised, instead of the calls waiting for Triton's
    network timeout."""

    def __init__(self) -> None:
        self.triton: TritonServer | None = None
        self.pid: int | None = None

    def attach(self, triton: TritonServer) -> TritonServer:
        """Watch ``triton`` (started) from now on."""
        self.triton, self.pid = triton, triton.pid
        return triton

    async def guard(self, work: Coroutine[Any, Any, T]) -> T:
        """The result of ``work``, unless the server dies first."""
        task = asyncio.ensure_future(work)
        while not task.done():
            await asyncio.wait({task}, timeout=CRASH_POLL_S)
            if not task.done() and self.triton is not None and not self.triton.running():
                task.cancel()
                self.kill()
                raise TritonCrashed(f"tritonserver exited during the run:\n"
                                    f"{self.triton.log_tail(1500)}")
        return task.result()

    def kill(self) -> None:
        """Kill whatever is left of the server's process group."""
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)


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
                                            config.time_scale)
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


def worker_errors(logs: Path, chars: int = 3000) -> str:
    """The tail of each worker log that holds a traceback (for an error message)."""
    tails = []
    for log in sorted(logs.glob("*.log")):
        text = log.read_text(errors="replace")
        if "Traceback" in text:
            tails.append(f"--- {log.name} ---\n{text[-chars:]}")
    return "\n".join(tails)


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


def setup_text(config: RealGpuConfig, points: Sequence[Point], seed: int,
               results: Sequence[RunResult]) -> str:
    """The setup paragraph of a ``mopd --mode real`` report section."""
    wall = sum(r.wall_s for r in results)
    return (
        f"Real stack on this machine: GPU pool workers over {config.gpus} simulated GPUs "
        f"(nodes of {config.node_size}, {GPU_MEMORY_MB // 1000} GB each for the GPU manager's "
        "bookkeeping), real Celery + Redis, and the real tritonserver (nvidia-pytriton) "
        "loading and unloading every (teacher, chunk) service through its repository API. "
        "The teachers are emulated (`tangram_celery/bench/teachers/model.py`): a load sleeps "
        "the restore time of the chunk it was really placed on, a call its Amdahl time on "
        f"that chunk. Every duration is at time scale {config.time_scale:g} and the LLM's "
        f"generation (think) times at {config.think_scale:g} on top (figures are wall seconds "
        "of the run); "
        f"restore physics load_init_s {config.load_init_s:g}, restore_gbps "
        f"{config.restore_gbps:g} (unscaled). Cross-request batching is off in every pool "
        "(`--no-batching`: the simulator models none). Each system gets a fresh Redis and a "
        f"fresh Triton. Workload `mopd` at points {[p.as_dict() for p in points]} (batch = "
        f"samples per RL step), seed {seed}; {len(results)} runs in {wall:.0f} s.\n\n"
        "Mean ACT and its parts per system (seconds; restores: calls that loaded their "
        "teacher; wall: the timed run):\n\n" + "\n".join(parts_table(results, len(points) > 1)))


def parts_table(results: Sequence[RunResult], with_point: bool = False) -> list[str]:
    """One Markdown row per run: mean ACT, queue, exec, overhead, restores, wall seconds."""
    head = ["system", "preset", "mean ACT", "queue", "exec", "overhead", "restores", "wall"]
    rows = []
    for run in results:
        records = run.records
        n = max(len(records), 1)
        means = [sum(getattr(r, part) for r in records) / n
                 for part in ("total", "queue", "exec", "overhead")]
        wall = f"{run.wall_s:.0f}" if isinstance(run, RealGpuRun) else ""
        cells = [run.system, run.costs, *(f"{m:.2f}" for m in means),
                 str(sum(r.loaded for r in records)), wall]
        rows.append(([str(run.point)] if with_point else []) + cells)
    head = (["point"] if with_point else []) + head
    return ["| " + " | ".join(row) + " |" for row in (head, ["---"] * len(head), *rows)]


PRESET_NAMES = {"real": "real", "sim": "simulated", MEASURED: "simulated with measured restores"}


def _order(summaries: Sequence[Summary]) -> str:
    ranked = sorted(summaries, key=lambda s: s.mean_act)
    return " < ".join(f"{s.system} {s.mean_act:.2f} s" for s in ranked)


def _ranking(summaries: Sequence[Summary]) -> list[str]:
    return [s.system for s in sorted(summaries, key=lambda s: s.mean_act)]


def report_notes(config: RealGpuConfig, summaries: Sequence[Summary],
                 results: Sequence[RunResult]) -> tuple[str, ...]:
    """The notes of a ``mopd --mode real`` report section: how the simulations beside it were
    run, the orderings and ratios real against simulated, what Triton did per system."""
    notes = [
        "*simulated, same workload and node* (`sim`): the simulator on the same GPUs (80 GB "
        "each), the same seeded workload at the same time scale, the same restore physics, "
        f"with a per-action dispatch cost of {DISPATCH_S * 1000:.0f} ms charged to the pooled "
        "systems (measured on this stack, see `mopd_real.DISPATCH_S`); the simulator's static "
        "services pay no dispatch, the real ones pay the same Celery path as everyone.",
        "Memory: the GPU manager keeps one memory figure per model, so each teacher declares "
        "its memory per GPU at its smallest parallelism (`tangram_memory_mb`); the simulator "
        "charges weights / dop x 1.2 per GPU at each parallelism. On the real stack a teacher "
        "on a larger chunk therefore reserves more memory per GPU than simulated (more "
        "evictions for the systems that scale teachers up; exact for celery and static).",
        "Estimates: a granted call that triggers a restore is expected to hold its chunk for "
        "the restore too (`Admission.postpone` by the pool's restore estimate), as the "
        "simulator's running jobs are. The pool's scheduler starts from "
        "one restore estimate for every teacher (`TANGRAM_GPU_RESTORE_S`, here the mean "
        "restore at the smallest parallelism) until it has measured each (teacher, chunk "
        "size); the simulator's knows them all from the start.",
        "The pool workers talk to Triton over gRPC: over HTTP each load holds one of Triton's "
        "HTTP threads and stalls the inference requests it serves (triton-inference-server/"
        "server#8958). The server runs one model-load thread per GPU "
        f"(`--model-load-thread-count={max(4, config.gpus)}`; Triton's default of 4 queues "
        "concurrent restores).",
    ]
    points = list(dict.fromkeys(str(s.point) for s in summaries))
    for point in points:
        here = [s for s in summaries if str(s.point) == point]
        where = "" if len(points) == 1 else f" at {point}"
        fit = restore_fit(r for r in results if str(r.point) == point)
        notes.append(
            f"*{MEASURED}*{where}: the same simulation, each restore charged what the real "
            f"runs' restores measured beyond the emulated time, {fit.fixed_s:.2f} s + "
            f"{fit.per_gpu_s:.2f} s per simulated GPU of the chunk (least squares over "
            f"{fit.samples} restores: the python-backend stub processes Triton starts, one per "
            "simulated GPU of the chunk, competing with the other loads and requests for this "
            "machine's 2 cores).")
        by_preset = {p: [s for s in here if s.costs == p] for p in PRESET_NAMES}
        real = by_preset["real"]
        if not real:
            continue
        orders = "; ".join(f"{PRESET_NAMES[p]} {_order(group)}"
                           for p, group in by_preset.items() if group)
        verdicts = ", ".join(
            f"real and {PRESET_NAMES[p]} "
            f"{'agree' if _ranking(group) == _ranking(real) else 'differ'}"
            for p, group in by_preset.items() if group and p != "real")
        notes.append(f"Order by mean ACT{where}: {orders}. Orderings: {verdicts}.")
        mine = {s.costs: s for s in here if s.system == "tangram"}
        for base in (s.system for s in real if s.system != "tangram"):
            pair = {s.costs: s for s in here if s.system == base}
            cells = [f"{PRESET_NAMES[p]} {ratio(pair[p].mean_act, mine[p].mean_act):.2f}x"
                     for p in PRESET_NAMES if p in pair and p in mine]
            notes.append(f"{base} / tangram mean ACT{where}: {', '.join(cells)}.")
    for result in results:
        if not isinstance(result, RealGpuRun):
            continue
        loads = sum(r.loaded for r in result.records)
        line = (f"{result.system} (real): {loads} calls restored their teacher in the timed "
                f"run; Triton's log: {result.triton_loads} loads, {result.triton_unloads} "
                "unloads")
        if result.system == "static":
            line += f"; {result.warmup_loads} replica loads before the timed run"
        if result.restores:
            measured = sum(m for _, m, _ in result.restores) / len(result.restores)
            emulated = sum(e for _, _, e in result.restores) / len(result.restores)
            line += f"; a restore took {measured:.2f} s on average ({emulated:.2f} s emulated)"
        if result.triton_crashes:
            line += (f"; tritonserver aborted {result.triton_crashes} time(s) "
                     "(`boost::interprocess::lock_exception`, triton-inference-server/server"
                     "#8882) and the run was started again from scratch")
        notes.append(line + ".")
    return tuple(notes)


def main(argv: Sequence[str] | None = None) -> int:
    """``tangram bench mopd --mode real`` with this module's defaults."""
    from tangram_celery.bench.suite import main as suite_main

    return suite_main(["mopd", "--mode", "real", *(argv or sys.argv[1:])])


if __name__ == "__main__":
    sys.exit(main())
