"""One system's run of the batch on a fresh local cluster: the rollouts, their records, the
scheduler's reported decisions."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tangram_bench.elastic.actions import (
    MALLEABLE,
    MALLEABLE_FIXED,
    Step,
    steps_for,
    worker_env,
)
from tangram_bench.elastic.records import gather
from tangram_bench.elastic.stock import run_stock
from tangram_bench.sim.record import ActionRecord, RunResult
from tangram_bench.workloads import Workload
from tangram_bench.workloads.model import ActionSpec
from tangram_celery.action import ActionResult
from tangram_celery.client import TangramClient
from tangram_celery.connection import connect
from tangram_celery.pools.registry import Registry
from tangram_celery.settings import Settings
from tangram_celery.stack.broker import embedded_redis
from tangram_celery.stack.demo import DemoConfig, local_cluster


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
              origin: float, held: Mapping[str, float] | None = None) -> ActionRecord:
    """A real action's result as a benchmark record (times relative to ``origin``); ``held``
    gives the unit-seconds of actions whose units changed while they ran (their units are then
    the mean they held)."""
    act, timings = result.act, result.timings
    submitted = timings.submitted - origin
    units = max(len(result.units), 1)
    spent = units * act["exec"]
    if held is not None and result.action_id in held:
        spent = held[result.action_id]
        units = max(1, round(spent / act["exec"])) if act["exec"] > 0 else units
    return ActionRecord(
        trajectory=trajectory, index=index, kind=result.kind, pool="cpu", node=result.node,
        units=units, submitted=submitted,
        started=(timings.admitted or timings.submitted) - origin,
        finished=submitted + act["total"], queue=act["queue"], exec=act["exec"],
        overhead=act["overhead"], held=spent, used=spec.t1,
        sched_s=timings.sched_s)


def held_unit_seconds(settings: Settings, nodes: Sequence[str]) -> dict[str, float]:
    """Each action's unit-seconds from the ``nodes``' allocation audit (a resized run's
    allocation is one record per unit count it held)."""
    client = connect(settings.broker)
    try:
        registry = Registry(client, settings.node.ttl_s, settings.actions.trajectory_ttl_s)
        held: dict[str, float] = defaultdict(float)
        for node in nodes:
            for record in registry.allocations(node):
                held[record["action_id"]] += len(record["units"]) * (
                    record["end"] - record["start"])
        return dict(held)
    finally:
        client.close()


def reported_decisions(settings: Settings, nodes: Sequence[str]) -> tuple[int, float]:
    """The scheduler calls and seconds the ``nodes`` report, after one more heartbeat (so the
    last decisions of the run are counted)."""
    time.sleep(settings.node.heartbeat_s + 0.5)
    client = connect(settings.broker)
    try:
        registry = Registry(client, settings.node.ttl_s, settings.actions.trajectory_ttl_s)
        return registry.decisions(nodes)
    finally:
        client.close()


def run_real(workload: Workload, system: str, cores: int, point: dict[str, object],
             tick: Callable[[int], None] | None = None,
             settings: Settings | None = None) -> RunResult:
    """Run ``workload`` on a fresh local cluster: one node worker of ``cores`` on the Redis of
    ``settings``, or, without settings, on a private embedded Redis (so no state of other runs
    or users of a shared Redis can leak in). ``celery`` runs on a stock Celery worker instead
    (:mod:`.stock`)."""
    if system == "celery":
        return run_stock(workload, cores, point, tick, settings)
    env = worker_env(system)
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
            env))
        client = stack.enter_context(TangramClient(live))
        origin = time.time()
        began = time.perf_counter()
        outcome = asyncio.run(run_batch(client, batch, tick))
        result.wall_s = time.perf_counter() - began
        nodes = DemoConfig(nodes=1, cores_per_node=cores).node_names
        result.decide_calls, result.decide_s = reported_decisions(live, nodes)
        held = held_unit_seconds(live, nodes) if system in (MALLEABLE, MALLEABLE_FIXED) \
            else None
    gather(result, workload, [
        [record_of(done, spec, trajectory.id, index, origin, held)
         for index, (spec, done) in enumerate(zip(trajectory.actions, results, strict=True))]
        for trajectory, results in zip(workload.trajectories, outcome, strict=True)], cores)
    failed = [r for r in (x for xs in outcome for x in xs) if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} actions failed on the real stack, e.g. "
                           f"{failed[0].action_id}: {failed[0].error}")
    return result
