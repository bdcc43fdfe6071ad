"""Bursty RL-step workload on the real stack: a static pool sized for the peak vs the autoscaler.

    python -m tangram_bench.autoscale [--bursts 3] [--trajectories 16] [--quiet 20]

Each burst is one RL step: ``trajectories`` trajectories start spread over ``ramp`` seconds (the
LLM finishes generating at different times); each runs ``steps`` actions one after the other
(an emulated exec sleeping ``action`` seconds on one core, then ``think`` seconds of "LLM time"),
then ends. Between bursts the pool is idle for ``quiet`` seconds (the trainer's update).

The same workload runs twice on a private Redis with real ``tangram worker cpu`` processes:

* ``static``: ``peak_nodes`` nodes of ``node_cores`` cores, up for the whole run;
* ``autoscaled``: the ``tangram autoscaler`` controller (local-process actuator) from
  ``min_nodes``, growing up to ``peak_nodes``.

It prints the average ACT (client-side, queue + exec + overhead) and the resource-seconds held
(cores x seconds, from the first submission to the last result; a draining node counts as held).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tangram_bench.emulation import emulated_exec
from tangram_celery.autoscale.controller import (
    AutoscalerOptions,
    Controller,
    local_controller,
    worker_env,
)
from tangram_celery.autoscale.policy import ScalingConfig
from tangram_celery.client import TangramClient
from tangram_celery.connection import connect
from tangram_celery.pools.launch import spawn_cpu_worker, wait_for_nodes
from tangram_celery.pools.registry import Registry
from tangram_celery.processes import stop_process
from tangram_celery.settings import Settings
from tangram_celery.stack.broker import embedded_redis


@dataclass(frozen=True)
class Workload:
    """The bursty workload's shape."""

    bursts: int = 3
    trajectories: int = 16
    steps: int = 4
    action_s: float = 2.0
    think_s: float = 0.5
    ramp_s: float = 8.0
    quiet_s: float = 40.0


@dataclass(frozen=True)
class RunResult:
    """One system's figures."""

    system: str
    actions: int
    failed: int
    mean_act_s: float
    mean_queue_s: float
    wall_s: float
    resource_s: float
    peak_nodes: int


def trajectory(settings: Settings, workload: Workload, acts: list[tuple[float, float, bool]],
               lock: threading.Lock) -> None:
    """Run one trajectory's actions in order and record (act, queue, ok) of each."""
    tid = f"t-{uuid.uuid4().hex[:10]}"
    with TangramClient(settings) as client:
        for _ in range(workload.steps):
            result = client.submit(emulated_exec(tid, workload.action_s)).result(timeout=300)
            act = result.act
            with lock:
                acts.append((act.get("total", 0.0), act.get("queue", 0.0), result.ok))
            time.sleep(workload.think_s)
        client.end_trajectory(tid)


def run_workload(settings: Settings, workload: Workload) -> list[tuple[float, float, bool]]:
    """Run every burst with its quiet period; returns the ACT records."""
    acts: list[tuple[float, float, bool]] = []
    lock = threading.Lock()
    for burst in range(workload.bursts):
        threads = []
        for i in range(workload.trajectories):
            time.sleep(workload.ramp_s / workload.trajectories if i else 0.0)
            thread = threading.Thread(target=trajectory, args=(settings, workload, acts, lock))
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join()
        if burst < workload.bursts - 1:
            time.sleep(workload.quiet_s)
    return acts


def summarise(system: str, acts: Sequence[tuple[float, float, bool]], wall_s: float,
              resource_s: float, peak_nodes: int) -> RunResult:
    """The figures of one run."""
    count = max(len(acts), 1)
    return RunResult(system, len(acts), sum(1 for a in acts if not a[2]),
                     sum(a[0] for a in acts) / count, sum(a[1] for a in acts) / count,
                     wall_s, resource_s, peak_nodes)


def run_static(settings: Settings, workload: Workload, nodes: int, cores: int,
               log_dir: Path) -> RunResult:
    """The static pool: ``nodes`` nodes up for the whole run."""
    client = connect(settings.broker)
    client.flushall()
    names = [f"static-{i}" for i in range(1, nodes + 1)]
    processes = [spawn_cpu_worker(worker_env(settings), n, cores, log_dir / f"{n}.log")
                 for n in names]
    try:
        registry = Registry(client, settings.node.ttl_s, settings.actions.trajectory_ttl_s)
        wait_for_nodes(registry, names, timeout=60)
        begin = time.time()
        acts = run_workload(settings, workload)
        wall = time.time() - begin
    finally:
        for process in processes:
            stop_process(process)
    return summarise("static", acts, wall, nodes * cores * wall, nodes)


def run_autoscaled(settings: Settings, workload: Workload, options: AutoscalerOptions,
                   log_dir: Path) -> RunResult:
    """The autoscaler from ``options.min_nodes``."""
    client = connect(settings.broker)
    client.flushall()
    controller = local_controller(settings, options, log_dir)
    stop = threading.Event()
    peak = 0
    with _controller_running(controller, stop):
        wait_for_nodes(Registry(client, settings.node.ttl_s, settings.actions.trajectory_ttl_s),
                       [f"auto-{i}" for i in range(1, options.min_nodes + 1)], timeout=60)
        held = controller.actuator.held  # type: ignore[attr-defined]
        begin = time.time()
        held_before = held.total(begin)
        acts = run_workload(settings, workload)
        end = time.time()
        resource = held.total(end) - held_before
        peak = max((t.target for _, d in controller.decisions for t in d.targets), default=0)
    return summarise("autoscaled", acts, end - begin, resource, peak)


@contextlib.contextmanager
def _controller_running(controller: Controller, stop: threading.Event) -> Iterator[None]:
    thread = threading.Thread(target=controller.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)
        controller.actuator.close()


def report(results: Sequence[RunResult]) -> str:
    """The table printed at the end, with the comparison line."""
    lines = [f"{'system':<11} {'actions':>7} {'failed':>6} {'avg ACT s':>9} {'avg queue s':>11} "
             f"{'wall s':>7} {'core-s held':>11} {'peak nodes':>10}"]
    for r in results:
        lines.append(f"{r.system:<11} {r.actions:>7} {r.failed:>6} {r.mean_act_s:>9.3f} "
                     f"{r.mean_queue_s:>11.3f} {r.wall_s:>7.1f} {r.resource_s:>11.1f} "
                     f"{r.peak_nodes:>10}")
    static, auto = results[0], results[-1]
    if len(results) == 2 and static.mean_act_s > 0 and static.resource_s > 0:
        lines.append(f"autoscaled vs static: ACT x{auto.mean_act_s / static.mean_act_s:.2f}, "
                     f"resource-seconds {100 * (1 - auto.resource_s / static.resource_s):.1f}% "
                     "fewer")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m tangram_bench.autoscale``."""
    parser = argparse.ArgumentParser(prog="python -m tangram_bench.autoscale",
                                     description=__doc__.split("\n")[0])
    base = Workload()
    for flag, value in (("bursts", base.bursts), ("trajectories", base.trajectories),
                        ("steps", base.steps), ("action", base.action_s),
                        ("think", base.think_s), ("ramp", base.ramp_s),
                        ("quiet", base.quiet_s)):
        parser.add_argument(f"--{flag}", type=type(value), default=value)
    parser.add_argument("--node-cores", type=int, default=2)
    parser.add_argument("--peak-nodes", type=int, default=4)
    parser.add_argument("--min-nodes", type=int, default=1)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--down-hold", type=float, default=5.0)
    parser.add_argument("--target-wait", type=float, default=2.0)
    parser.add_argument("--min-growth", type=float, default=2.0)
    parser.add_argument("--verbose", action="store_true",
                        help="log every autoscaler decision to stderr")
    args = parser.parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(relativeCreated)8.0fms %(message)s")
        logging.getLogger("celery").setLevel(logging.WARNING)
    workload = Workload(args.bursts, args.trajectories, args.steps, args.action, args.think,
                        args.ramp, args.quiet)
    options = AutoscalerOptions(
        interval_s=args.interval, node_cores=args.node_cores, min_nodes=args.min_nodes,
        max_nodes=args.peak_nodes, drain_timeout_s=60.0,
        scaling=ScalingConfig(target_wait_s=args.target_wait, down_hold_s=args.down_hold,
                              min_growth=args.min_growth),
    )
    with embedded_redis() as server, tempfile.TemporaryDirectory() as tmp:
        settings = Settings.from_env({}, redis_url=server.url, node_heartbeat_s=0.5,
                                     node_ttl_s=3.0)
        print(f"workload: {workload}; nodes of {args.node_cores} cores, static "
              f"{args.peak_nodes}, autoscaled {args.min_nodes}..{args.peak_nodes} ({options})",
              flush=True)
        static = run_static(settings, workload, args.peak_nodes, args.node_cores, Path(tmp))
        print(report([static]), flush=True)
        auto = run_autoscaled(settings, workload, options, Path(tmp))
        print(report([static, auto]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
