"""Running the points of ``tangram bench``: every system at every point under every preset and
for every seed, simulated or on the real stack, with a progress bar per run."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tangram_bench import mopd_real
from tangram_bench.elastic import run_real
from tangram_bench.malleable_flags import knobs
from tangram_bench.mopd_real import config as mopd_config
from tangram_bench.plan import Point
from tangram_bench.resolve import Plan, gpu_config, physics
from tangram_bench.sim.cluster import Cluster
from tangram_bench.sim.costs import PRESETS, charged
from tangram_bench.sim.durations import DEFAULT_DURATIONS, parse_durations
from tangram_bench.sim.record import RunResult
from tangram_bench.sim.systems import simulate, system
from tangram_bench.summary import Summary, summarize
from tangram_bench.workloads import Workload

Runner = Callable[[Workload, str, Point, str, int, Callable[[int], None]], RunResult]
"""Runs (workload, system, point, preset, seed, progress callback) to its result."""


def with_measured(args: argparse.Namespace, plan: Plan, results: list[RunResult],
                   ) -> tuple[Plan, list[RunResult], list[Summary]]:
    """``mopd --mode real`` also simulates every system with the restore times its real runs
    measured (preset ``sim-measured``, see :func:`tangram_bench.mopd_real.restore_fit`);
    the plan, results and summaries with those runs, each point's systems in order."""
    added = []
    for point in plan.points:
        here = [r for r in results if r.costs == "real" and r.point == point.as_dict()]
        cluster = gpu_config(args, point).cluster(mopd_real.restore_fit(here))
        workload = plan.workload(point, args.seed)
        for real in here:
            run = simulate(workload, real.system, cluster, mopd_config.SIM_COSTS, seed=args.seed,
                           point=point.as_dict(), default_policy=args.policy,
                           durations=parse_durations(gpu_config(args, point).durations))
            run.costs, run.seed = mopd_config.MEASURED, args.seed
            added.append(run)
    plan = replace(plan, presets=[*plan.presets, mopd_config.MEASURED])
    keys = [str(p.as_dict()) for p in plan.points]

    def rank(run: RunResult) -> tuple[int, int, int]:
        return (keys.index(str(run.point)), plan.systems.index(run.system),
                plan.presets.index(run.costs))

    ordered = sorted([*results, *added], key=rank)
    return plan, ordered, [summarize(r, r.costs) for r in ordered]


def runner(args: argparse.Namespace) -> Runner:
    """Runs one system at one point under one preset: simulated, or on the real stack (preset
    ``real``), or simulated on the real stack's single node (preset ``sim`` of the real mode,
    with the control-plane costs) so both orderings can be compared like with like."""

    def run(workload: Workload, system: str, point: Point, preset: str, seed: int,
            tick: Callable[[int], None]) -> RunResult:
        if args.mode == "real" and args.workload == "mopd":
            config = gpu_config(args, point)
            if preset == "real":
                return mopd_real.run_real(workload, system, config, point.as_dict(), tick)
            return simulate(workload, system, config.cluster(), mopd_config.SIM_COSTS,
                            seed=seed, point=point.as_dict(), progress=tick,
                            default_policy=args.policy,
                            durations=parse_durations(config.durations))
        durations = parse_durations(getattr(args, "durations", DEFAULT_DURATIONS))
        if preset == "real":
            return run_real(workload, system, point.cores, point.as_dict(), tick)
        if args.mode == "real":
            node = Cluster(cpu_nodes=1, cores_per_node=point.cores, numa_per_node=1)
            return simulate(workload, system, node, PRESETS["cp"], seed=seed,
                            point=point.as_dict(), progress=tick, default_policy=args.policy,
                            durations=durations,
                            knobs=knobs(args) if hasattr(args, "grow_cost") else None)
        return simulate(workload, system, point.cluster(physics(args)), PRESETS[preset],
                        seed=seed, point=point.as_dict(), progress=tick,
                        default_policy=args.policy, durations=durations,
                        knobs=knobs(args) if hasattr(args, "grow_cost") else None)

    return run


def run_all(plan: Plan, runner: Runner) -> tuple[list[RunResult], list[Summary]]:
    """Every system at every point under every preset for every seed, with a progress bar. A
    simulated preset that charges a system the same costs as one it already ran under reuses
    that run (``same_as``)."""
    results: list[RunResult] = []
    done: dict[tuple[Any, ...], RunResult] = {}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns) as progress:
        total = len(plan.points) * len(plan.systems) * len(plan.presets) * len(plan.seeds)
        overall = progress.add_task("runs", total=total)
        for point in plan.points:
            for seed in plan.seeds:
                workload = plan.workload(point, seed)
                for name in plan.systems:
                    for preset in plan.presets:
                        key = _same_run(name, str(point.as_dict()), seed, preset)
                        if key is not None and key in done:
                            first = done[key]
                            result: RunResult | None = replace(
                                first, costs=preset, same_as=first.costs, wall_s=0.0)
                        else:
                            result = _run_one(progress, runner, workload, name, point, preset,
                                              seed)
                        if result is not None:
                            results.append(result)
                            if key is not None:
                                done.setdefault(key, result)
                        progress.advance(overall)
    return results, [summarize(r, r.costs) for r in results]


def _same_run(name: str, point: str, seed: int, preset: str) -> tuple[Any, ...] | None:
    """What makes two simulated runs the same: system, point, seed and the costs it pays."""
    if preset not in PRESETS:
        return None
    return (name, point, seed, charged(PRESETS[preset], system(name).pooled))


def _run_one(progress: Progress, runner: Runner, workload: Workload, system: str, point: Point,
             preset: str, seed: int) -> RunResult | None:
    """One run with its own progress bar; None when the system cannot run at this point."""
    label = escape(f"{system} [{preset}] {point.as_dict()} seed {seed}")
    task = progress.add_task(label, total=workload.action_count())

    def tick(done: int) -> None:
        progress.update(task, completed=done)

    try:
        result = runner(workload, system, point, preset, seed, tick)
    except ValueError as exc:
        progress.console.print(f"skipped {label}: {escape(str(exc))}")
        progress.remove_task(task)
        return None
    progress.update(task, completed=len(result.records))
    result.costs = preset
    result.seed = seed
    return result
