"""The outputs of ``tangram bench``: every action's ACT parts, the summaries, the report section
and its plots, ``results.md`` rebuilt, and the README's results block."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tangram_bench import plots
from tangram_bench.mopd_real import report_notes, setup_text
from tangram_bench.plan import headline
from tangram_bench.report import Section, publish, section
from tangram_bench.resolve import Plan, gpu_config, physics
from tangram_bench.sim.durations import DEFAULT_DURATIONS, ablation
from tangram_bench.sim.record import RunResult
from tangram_bench.summary import Summary
from tangram_bench.tables import gpu_parity, spread

FIELDS = ("trajectory", "index", "kind", "node", "units", "submitted", "started", "finished",
          "queue", "exec", "overhead", "total")


def write(args: argparse.Namespace, command: str, plan: Plan, results: list[RunResult],
           summaries: list[Summary]) -> None:
    name = "-".join(part for part in (args.workload, args.mode, args.sweep, args.tag) if part)
    folder = args.out / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.actions.json").write_text(json.dumps(actions_json(results)))
    (folder / f"{name}.json").write_text(json.dumps([asdict(s) for s in summaries], indent=1))
    chosen = headline(plan.points, plan.base, args.sweep).as_dict()
    top = [s for s in summaries if s.point == chosen]
    first = [i for i, r in enumerate(results) if r.seed == plan.seeds[0]]
    plotted = _plots(folder, name, args.sweep, plan.presets, [results[i] for i in first],
                     [summaries[i] for i in first], chosen)
    setup = _setup(args, plan, results)
    notes = _notes(args, plan, [summaries[i] for i in first], results, top)
    text = section(Section(name, command, setup, tuple(plan.presets), args.sweep, top,
                           summaries, plotted, notes))
    publish(args.out, name, text)
    print(text)


def _notes(args: argparse.Namespace, plan: Plan, summaries: list[Summary],
           results: list[RunResult], top: list[Summary]) -> tuple[str, ...]:
    if args.mode == "real" and args.workload == "mopd":
        return report_notes(gpu_config(args, plan.base), summaries, results)
    if args.sweep == "gpus":
        seed = f" (seed {plan.seeds[0]})" if len(plan.seeds) > 1 else ""
        return tuple(gpu_parity(summaries, preset) + seed for preset in plan.presets)
    if args.mode == "real":
        return ("*simulated, same workload and node*: the simulator on one node of the same "
                "cores, the same seeded workload, with the control-plane costs (tangram's "
                "measured per-action dispatch cost), to compare the orderings like with like. "
                "It has one FIFO-at-one-core system, so `fcfs-min` and `celery` share its "
                "figures; it charges both tangram's dispatch cost, which the stock worker does "
                "not pay (no sandbox).",)
    return bound_note(plan, top)


def bound_note(plan: Plan, summaries: list[Summary]) -> tuple[str, ...]:
    """The no-queue bound at the headline point (`Workload.unqueued_external_s`), and how far
    ahead of each fixed DoP it would be: no scheduler can be further ahead."""
    if not summaries:
        return ()
    point = next(p for p in plan.points if p.as_dict() == summaries[0].point)
    bounds = {seed: plan.workload(point, seed).unqueued_external_s() for seed in plan.seeds}
    if any(bound is None for bound in bounds.values()):
        return ()
    clean = {seed: float(bound or 0.0) for seed, bound in bounds.items()}
    fixed = sorted({s.system for s in summaries if s.system.startswith("fixed-dop-")},
                   key=lambda name: int(name.split("-")[-1].split(":")[0]))
    ratios = {name: [s.external / clean[s.seed] for s in summaries
                     if s.system == name and s.costs == "sched"] for name in fixed}
    ahead = "; ".join(f"{name} {spread(values, times=True)}"
                      for name, values in ratios.items() if values)
    return (f"No-queue bound at {summaries[0].point}: every action alone at its largest "
            f"count, nothing waiting, no overhead: {spread(list(clean.values()))} s external "
            "time per trajectory (mean (range) over the seeds). No scheduler, on any number "
            "of cores, is further ahead of a system than its external time / this bound"
            + (f" (scheduling costs alone): {ahead}." if ahead else "."),)


def _plots(folder: Path, name: str, sweep: str | None, presets: list[str],
           results: list[RunResult], summaries: list[Summary],
           chosen: dict[str, object]) -> dict[str, str]:
    first = presets[0]
    picked = [r for r, s in zip(results, summaries, strict=True)
              if s.point == chosen and s.costs == first]
    made: dict[str, str] = {}
    if not picked:
        return made
    cdf = folder / f"{name}-cdf.png"
    plots.act_cdf({r.system: acts_by_kind(r) for r in picked}, cdf,
                  f"{name}: ACT CDF ({first}, {chosen})")
    made["ACT CDF"] = cdf.name
    bars = folder / f"{name}-breakdown.png"
    plots.breakdown([s for s in summaries if s.point == chosen and s.costs == first], bars,
                    f"{name}: ACT breakdown ({first})")
    made["ACT breakdown"] = bars.name
    if sweep:
        line = folder / f"{name}-sweep.png"
        plots.sweep([s for s in summaries if s.costs == first], sweep, line,
                    f"{name}: against {sweep} ({first})")
        made[f"ACT against {sweep}"] = line.name
    return made


def _setup(args: argparse.Namespace, plan: Plan, results: list[RunResult]) -> str:
    all_points = plan.points
    wall = sum(r.wall_s for r in results)
    if args.mode == "real" and args.workload == "mopd":
        return setup_text(gpu_config(args, all_points[0]), all_points, args.seed, results)
    if args.mode == "real":
        seeds = ", ".join(str(seed) for seed in plan.seeds)
        return (f"Real stack on this machine: one CPU node worker with {all_points[0].cores} "
                "emulated cores (units are real exclusive allocations; work is emulated by "
                "sleeping T1/S(m)), Celery + Redis + bubblewrap sandboxes; durations told to "
                "the policies: `learned` (no action declares its duration; the node learns "
                "them by signature). `fcfs-min` is tangram's node at one core "
                "per action in arrival order; `celery` is a stock Celery worker (prefork, one "
                "process per core) running each command in a plain subprocess, without "
                "sandbox or tangram code. `tangram:malleable` is tangram's node resizing "
                "running test runs (`TANGRAM_MALLEABLE_RESIZE=1`): its test runs are real "
                "pytest runs through the malleable runner of a generated suite (a serial test "
                "of (1-p) T1, then parallel tests sharing p T1, each a sleep), so a run goes "
                "as fast as the workers it has at each moment and pays each worker's start for "
                "real; `tangram:malleable-fixed` runs the same malleable runs on a node "
                "that does not resize them (the runner's cost without resizing). "
                "The machine's CPUs are fewer than the emulated cores and shared with "
                f"other jobs. Seeds {seeds}; {len(results)} runs in {wall:.0f} s.")
    cluster = all_points[0].cluster(physics(args))
    rows = "\n".join(f"| {flag} | {value} | {source} |"
                     for flag, value, source in cluster.physics())
    seeds = ", ".join(str(seed) for seed in plan.seeds)
    many = (f"seeds {seeds} (each figure: the mean over them, (min-max) their range; plots "
            f"and per-system tables: seed {plan.seeds[0]})" if len(plan.seeds) > 1
            else f"seed {seeds}")
    durations = getattr(args, "durations", DEFAULT_DURATIONS)
    return (f"Simulated: CPU nodes of 256 cores, GPU nodes of 8 x 80 GB GPUs; workload "
            f"`{args.workload}`, {many}; durations told to the policies: "
            f"`{durations}`{ablation(durations)}; points "
            f"{[p.as_dict() for p in all_points]}; {len(results)} runs in {wall:.0f} s of "
            f"simulation wall time on this machine{_reused(results)}.\n\nPhysical costs "
            "(charged in every preset):\n\n| flag | value | source |\n| --- | --- | --- |\n" + rows)


def _reused(results: list[RunResult]) -> str:
    same = sum(1 for r in results if r.same_as)
    return (f" ({same} of them reuse the run of another preset that charges that system the "
            "same costs, e.g. a pod cap charges pooled systems nothing)" if same else "")


def acts_by_kind(result: RunResult) -> dict[str, list[float]]:
    """A run's ACTs per action kind."""
    acts: dict[str, list[float]] = {}
    for record in result.records:
        acts.setdefault(record.kind, []).append(record.total)
    return acts


def actions_json(results: Sequence[RunResult]) -> dict[str, Any]:
    """Every action's ACT parts per run, as rows under ``fields``."""
    runs = []
    for result in results:
        rows = [[r.trajectory, r.index, r.kind, r.node, r.units, round(r.submitted, 6),
                 round(r.started, 6), round(r.finished, 6), round(r.queue, 6), round(r.exec, 6),
                 round(r.overhead, 6), round(r.total, 6)] for r in result.records]
        runs.append({"system": result.system, "costs": result.costs, "point": result.point,
                     "actions": rows})
    return {"fields": list(FIELDS), "runs": runs}
