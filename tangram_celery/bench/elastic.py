"""The AI-coding workload on the real stack: tangram vs fixed DoP vs plain FIFO, side by side.

    python -m tangram_celery.bench.elastic [--batch 8] [--cores 8] [--seed 1]
    (the same as: tangram bench coding --mode real
     --systems tangram,tangram:ersa,fixed-dop-4,celery)

One CPU node worker (real Celery, Redis, bubblewrap sandboxes, audited core allocations) runs
the same seeded AI-coding batch (the simulator's generator at a smaller scale, see
:data:`REAL_PARAMS`) once per system:

* ``tangram``: the default ``TANGRAM_SCHEDULER`` (robust), test runs elastic over 1..cores;
* ``tangram:ersa``: the paper's allocator (``TANGRAM_SCHEDULER=elastic``), the same actions;
* ``fixed-dop-<k>``: the same scheduler, every test run declaring exactly ``min(k, cores)``
  cores (a single-option job is admitted FCFS at that count: the fixed-DoP baseline, no
  node-side policy needed);
* ``celery``: ``TANGRAM_SCHEDULER=fcfs-min``, every action at one core, strict FIFO.

Test runs emulate their work by sleeping T1/S(m) for the m cores they really got (see
:mod:`tangram_celery.bench.emulation`); exec actions sleep their duration on one core.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import redis

from tangram_celery.action import Action, ActionResult
from tangram_celery.bench.emulation import emulated_exec, emulated_test_run
from tangram_celery.client import TangramClient
from tangram_celery.pools.registry import Registry
from tangram_celery.settings import Settings
from tangram_celery.sim.record import ActionRecord, RunResult
from tangram_celery.stack.broker import embedded_redis
from tangram_celery.stack.demo import DemoConfig, local_cluster
from tangram_celery.workloads import CodingParams, Workload, coding
from tangram_celery.workloads.model import ActionSpec

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


WORKER_SCHEDULERS = {"robust": "robust", "ersa": "elastic"}
"""The node worker's ``TANGRAM_SCHEDULER`` for each simulator policy the real stack can run."""


def scheduler_for(system: str) -> str:
    """The node scheduler (``TANGRAM_SCHEDULER``) a real-stack system runs with: ``tangram`` the
    default one, ``tangram:ersa`` the paper's allocator (as fixed DoP does), ``celery`` FIFO."""
    if system == "celery":
        return "fcfs-min"
    if system == "tangram":
        return Settings.from_env({}).scheduler
    if system.startswith("tangram:") and system.split(":", 1)[1] in WORKER_SCHEDULERS:
        return WORKER_SCHEDULERS[system.split(":", 1)[1]]
    if re.fullmatch(r"fixed-dop-\d+", system):
        return "elastic"
    raise ValueError(f"the real stack runs tangram, tangram:{{{','.join(WORKER_SCHEDULERS)}}}, "
                     f"fixed-dop-<k> or celery, not {system!r}")


def action_for(spec: ActionSpec, trajectory_id: str, system: str, cores: int) -> Action:
    """The emulated action of ``spec`` as ``system`` submits it."""
    if spec.kind != "test_run":
        action = emulated_exec(trajectory_id, spec.t1)
    else:
        fixed = re.fullmatch(r"fixed-dop-(\d+)", system)
        low = min(int(fixed.group(1)), cores) if fixed else 1
        high = low if fixed else cores
        action = emulated_test_run(trajectory_id, round(spec.t1, 3), round(spec.parallel, 3),
                                   high, min_units=low)
    return replace(action, trajectory_memory_mb=TRAJECTORY_MEMORY_MB)


def steps_for(workload: Workload, system: str, cores: int, tag: str) -> list[list[Step]]:
    """Every trajectory's steps, with ids made unique by ``tag``."""
    return [
        [Step(spec.think_s, action_for(spec, f"{tag}-{t.id}", system, cores))
         for spec in t.actions]
        for t in workload.trajectories
    ]


async def _rollout(client: TangramClient, steps: list[Step],
                   done: Callable[[], None]) -> list[ActionResult]:
    results = []
    for step in steps:
        await asyncio.sleep(step.think_s)
        results.append(await client.submit(step.action))
        done()
    client.end_trajectory(steps[0].action.trajectory_id)
    return results


async def run_batch(client: TangramClient, batch: list[list[Step]],
                    tick: Callable[[int], None] | None = None) -> list[list[ActionResult]]:
    """Run all trajectories concurrently; results per trajectory; ``tick(n)`` after each."""
    count = [0]

    def done() -> None:
        count[0] += 1
        if tick is not None:
            tick(count[0])

    return list(await asyncio.gather(*(_rollout(client, steps, done) for steps in batch)))


def record_of(result: ActionResult, spec: ActionSpec, trajectory: str, index: int,
              origin: float) -> ActionRecord:
    """A real action's result as a benchmark record (times relative to ``origin``)."""
    act, timings = result.act, result.timings
    submitted = timings.submitted - origin
    units = max(len(result.units), 1)
    return ActionRecord(
        trajectory=trajectory, index=index, kind=result.kind, pool="cpu", node=result.node,
        units=units, submitted=submitted,
        started=(timings.admitted or timings.submitted) - origin,
        finished=submitted + act["total"], queue=act["queue"], exec=act["exec"],
        overhead=act["overhead"], held=units * act["exec"], used=spec.t1,
        sched_s=timings.sched_s)


def reported_decisions(settings: Settings, nodes: Sequence[str]) -> tuple[int, float]:
    """The scheduler calls and seconds the ``nodes`` report, after one more heartbeat (so the
    last decisions of the run are counted)."""
    time.sleep(settings.node_heartbeat_s + 0.5)
    client = redis.Redis.from_url(settings.redis_url)
    try:
        return Registry(client, settings.node_ttl_s, settings.trajectory_ttl_s).decisions(nodes)
    finally:
        client.close()


def run_real(workload: Workload, system: str, cores: int, point: dict[str, object],
             tick: Callable[[int], None] | None = None,
             settings: Settings | None = None) -> RunResult:
    """Run ``workload`` on a fresh local cluster: one node worker of ``cores`` on the Redis of
    ``settings``, or, without settings, on a private embedded Redis (so no state of other runs
    or users of a shared Redis can leak in)."""
    scheduler = scheduler_for(system)
    tag = f"{system}-{int(time.time() * 1000) % 10**9}"
    batch = steps_for(workload, system, cores, tag)
    result = RunResult(system, workload.name, point)
    with contextlib.ExitStack() as stack:
        if settings is None:
            server = stack.enter_context(embedded_redis())
            settings = Settings.from_env().with_(redis_url=server.url, result_url="")
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tangram-bench-")))
        live = stack.enter_context(local_cluster(
            settings, DemoConfig(nodes=1, cores_per_node=cores), logs,
            {"TANGRAM_SCHEDULER": scheduler}))
        client = stack.enter_context(TangramClient(live))
        origin = time.time()
        began = time.perf_counter()
        outcome = asyncio.run(run_batch(client, batch, tick))
        result.wall_s = time.perf_counter() - began
        result.decide_calls, result.decide_s = reported_decisions(
            live, DemoConfig(nodes=1, cores_per_node=cores).node_names)
    for trajectory, results in zip(workload.trajectories, outcome, strict=True):
        mine = [record_of(done, spec, trajectory.id, index, origin)
                for index, (spec, done) in enumerate(zip(trajectory.actions, results,
                                                         strict=True))]
        began = mine[0].submitted - trajectory.actions[0].think_s
        result.trajectory_times[trajectory.id] = mine[-1].finished - began
        result.records.extend(mine)
    result.makespan = max((r.finished for r in result.records), default=0.0)
    result.step_times = [result.makespan]
    result.reserved = sum(r.held for r in result.records)
    result.capacity["cpu"] = float(cores)
    failed = [r for r in (x for xs in outcome for x in xs) if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} actions failed on the real stack, e.g. "
                           f"{failed[0].action_id}: {failed[0].error}")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """``tangram bench coding --mode real`` with this module's defaults."""
    from tangram_celery.bench.suite import main as suite_main

    return suite_main(["coding", "--mode", "real", *(argv or sys.argv[1:])])


if __name__ == "__main__":
    sys.exit(main())
