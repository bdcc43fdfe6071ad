"""Elastic scheduling against every action fixed at one core, on the real stack, side by side.

    python -m tangram_celery.bench.elastic [--trajectories 4,12] [--cores 8] [--seed 1]

One CPU node worker (real Celery, Redis, bubblewrap sandboxes, audited core allocations) runs
the same seeded agentic-coding batch twice: with the elastic scheduler, then with
``TANGRAM_SCHEDULER=fcfs-min`` (every action at its minimum, one core). Test runs are elastic
(Amdahl, 1..cores) and emulate their work by sleeping T1/S(m) for the m cores they really got
(see :mod:`tangram_celery.bench.emulation`); exec actions are short and inelastic.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tangram_celery.action import Action, ActionResult
from tangram_celery.bench.emulation import emulated_exec, emulated_test_run
from tangram_celery.client import TangramClient
from tangram_celery.demo import DemoConfig, local_cluster
from tangram_celery.report import act_table, summarize
from tangram_celery.settings import Settings


@dataclass(frozen=True)
class Step:
    """One step of a trajectory: think for ``think_s``, then run ``action``."""

    think_s: float
    action: Action


def workload(trajectories: int, cores: int, seed: int, tag: str) -> list[list[Step]]:
    """The seeded batch: per trajectory 3 short exec actions, then one elastic test run."""
    rng = random.Random(seed)
    batch = []
    for t in range(trajectories):
        tid = f"{tag}-{t}"
        steps = [Step(rng.uniform(0.0, 1.0), emulated_exec(tid, rng.uniform(0.05, 0.3)))]
        steps += [Step(rng.uniform(0.1, 0.4), emulated_exec(tid, rng.uniform(0.05, 0.3)))
                  for _ in range(2)]
        t1, p = rng.uniform(1.5, 4.0), rng.uniform(0.8, 0.97)
        steps.append(Step(rng.uniform(0.1, 0.4), emulated_test_run(tid, round(t1, 3),
                                                                   round(p, 3), cores)))
        batch.append(steps)
    return batch


async def _rollout(client: TangramClient, steps: list[Step]) -> list[ActionResult]:
    results = []
    for step in steps:
        await asyncio.sleep(step.think_s)
        results.append(await client.submit(step.action))
    client.end_trajectory(steps[0].action.trajectory_id)
    return results


async def run_batch(client: TangramClient, batch: list[list[Step]]) -> list[ActionResult]:
    """Run all trajectories concurrently; results flattened."""
    done = await asyncio.gather(*(_rollout(client, steps) for steps in batch))
    return [r for results in done for r in results]


def run_mode(settings: Settings, scheduler: str, trajectories: int, args: argparse.Namespace,
             logs: Path) -> tuple[list[ActionResult], float]:
    """One full run of the batch with the node worker using ``scheduler``."""
    config = DemoConfig(nodes=1, cores_per_node=args.cores)
    with local_cluster(settings, config, logs, {"TANGRAM_SCHEDULER": scheduler}) as live, \
            TangramClient(live) as client:
        batch = workload(trajectories, args.cores, args.seed, f"{scheduler}-{time.time():.0f}")
        started = time.time()
        results = asyncio.run(run_batch(client, batch))
        return results, time.time() - started


def mean_act(results: Sequence[ActionResult], kind: str | None = None) -> float:
    """Average ACT in seconds (of one kind, or of all)."""
    return statistics.fmean(r.act["total"] for r in results if kind in (None, r.kind))


def compare(settings: Settings, trajectories: int, args: argparse.Namespace,
            logs: Path) -> list[str]:
    """Run both modes at one load; print their tables; return the summary lines."""
    outcome = {}
    for mode in ("elastic", "fcfs-min"):
        results, makespan = run_mode(settings, mode, trajectories, args, logs)
        failed = [r for r in results if not r.ok]
        print(f"\n== {mode}, {trajectories} trajectories: {len(results)} actions, makespan "
              f"{makespan:.2f} s, failed {len(failed)}")
        print(act_table(summarize(results)))
        outcome[mode] = (results, makespan)
    elastic, fixed = outcome["elastic"][0], outcome["fcfs-min"][0]
    lines = []
    for kind in ("exec", "test_run", None):
        a, b = mean_act(elastic, kind), mean_act(fixed, kind)
        lines.append(f"{trajectories:>5} {kind or 'all':<9} {a:9.3f} {b:9.3f} {b / a:8.2f}x")
    a, b = outcome["elastic"][1], outcome["fcfs-min"][1]
    lines.append(f"{trajectories:>5} {'makespan':<9} {a:9.2f} {b:9.2f} {b / a:8.2f}x")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Run both modes at each load and print their ACT tables and ratios."""
    parser = argparse.ArgumentParser(prog="python -m tangram_celery.bench.elastic")
    parser.add_argument("--trajectories", default="4,12",
                        help="comma-separated batch sizes (loads) to compare at")
    parser.add_argument("--cores", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    lines = []
    with tempfile.TemporaryDirectory(prefix="tangram-bench-") as logs:
        for trajectories in (int(t) for t in args.trajectories.split(",")):
            lines += compare(settings, trajectories, args, Path(logs))
    print(f"\naverage ACT (s) on one {args.cores}-core node, seed {args.seed}; "
          "ratio = fixed-1 / elastic (> 1: elastic is faster)")
    print(f"{'traj':>5} {'kind':<9} {'elastic':>9} {'fixed-1':>9} {'ratio':>9}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
