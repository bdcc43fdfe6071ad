"""``tangram bench``: the paper's experiments as one command, simulated or on the real stack.

    tangram bench coding --mode sim --sweep batch --out docs
    tangram bench mopd --mode sim --sweep gpus --systems tangram,static,fixed-dop-4,celery
    tangram bench coding --mode real --systems tangram,fixed-dop-4,celery --batch 8 --cores 8
    tangram bench mopd --mode real [--batch 48] [--gpus 24] [--time-scale 1] [--think-scale 0.1]
    tangram bench trace --trace mine.jsonl --mode sim
    tangram bench robustness [--scale 4] [--ablations]   (see bench.robustness)

Workloads: ``coding``, ``mopd``, ``deepsearch`` (seeded generators) or ``trace`` (a JSON Lines
file, see :mod:`tangram_celery.workloads.trace`). Systems: see
:mod:`tangram_celery.sim.systems`. Each invocation writes, under ``--out``:

* ``bench/<name>.actions.json``: every action's ACT parts, per run;
* ``bench/<name>.json``: the summaries; ``bench/<name>.md``: the report section;
* ``bench/<name>-cdf.png``, ``-breakdown.png`` and, for sweeps, ``-sweep.png``;
* ``results.md``: every section under ``--out/bench``, rebuilt (never edit it by hand).

``<name>`` is ``<workload>-<mode>[-<sweep>][-<tag>]``. The real mode also simulates the same
workload on the same single node (preset ``sim``), so the two orderings compare like with like.
The real mode runs ``coding`` (one CPU node worker, :mod:`tangram_celery.bench.elastic`) and
``mopd`` (GPU pool workers on a real tritonserver with emulated teachers, at ``--time-scale``,
:mod:`tangram_celery.bench.mopd_real`; simulated beside it on the same GPUs at the same scale).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tangram_celery.bench import plots
from tangram_celery.bench.plan import SWEEPS, Point, headline, points, workload_at
from tangram_celery.bench.report import Section, index, section, write_readme
from tangram_celery.bench.summary import Summary, summarize
from tangram_celery.bench.tables import gpu_parity
from tangram_celery.sim.cluster import Cluster
from tangram_celery.sim.costs import PRESETS
from tangram_celery.sim.invariants import violations
from tangram_celery.sim.policy import DEFAULT_POLICY
from tangram_celery.sim.record import RunResult
from tangram_celery.sim.systems import DEFAULT_SYSTEMS, simulate, system
from tangram_celery.workloads import GENERATORS, Workload, read_trace

if TYPE_CHECKING:
    from tangram_celery.bench.mopd_real import RealGpuConfig

REAL_SYSTEMS = ("tangram", "tangram:ersa", "fixed-dop-4", "celery")
REAL_GPU_SYSTEMS = ("tangram", "tangram:ersa", "celery", "static")
"""The systems of ``mopd --mode real`` (:data:`tangram_celery.bench.mopd_real.SYSTEMS`)."""
REAL_WORKLOADS = ("coding", "mopd")
FIELDS = ("trajectory", "index", "kind", "node", "units", "submitted", "started", "finished",
          "queue", "exec", "overhead", "total")
Runner = Callable[[Workload, str, Point, str, Callable[[int], None]], RunResult]


def build_parser() -> argparse.ArgumentParser:
    """The arguments of ``tangram bench``."""
    parser = argparse.ArgumentParser(prog="tangram bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", choices=[*sorted(GENERATORS), "trace"])
    parser.add_argument("--systems", default=None,
                        help="comma-separated systems (sim default: "
                             f"{','.join(DEFAULT_SYSTEMS)}; real: {','.join(REAL_SYSTEMS)}; "
                             f"mopd real: {','.join(REAL_GPU_SYSTEMS)})")
    parser.add_argument("--mode", choices=("sim", "real"), default="sim")
    parser.add_argument("--sweep", choices=sorted(SWEEPS), default=None)
    parser.add_argument("--points", default=None, help="comma-separated sweep values")
    parser.add_argument("--batch", type=int, default=None,
                        help="trajectories (samples per step for mopd); sim 1280, real 8 "
                             "(mopd real 48)")
    parser.add_argument("--cores", type=int, default=None,
                        help="CPU cores: sim 1280 (multiple of 256), real: one node's cores (8)")
    parser.add_argument("--gpus", type=int, default=None,
                        help="GPUs (multiple of 8): 40, mopd real 24 (static needs 20 to host "
                             "one replica of each of the 8 teachers)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--costs", default="sched,cp",
                        help="cost presets: sched (scheduling alone), cp (control plane)")
    parser.add_argument("--policy", default=DEFAULT_POLICY, help="tangram's default policy")
    parser.add_argument("--trace", type=Path, default=None, help="JSON Lines trace to replay")
    parser.add_argument("--load-init-s", type=float, default=None,
                        help="GPU service restore: fixed seconds (default 2.0)")
    parser.add_argument("--restore-gbps", type=float, default=None,
                        help="GPU service restore: GB/s per GPU (default 10)")
    parser.add_argument("--time-scale", type=float, default=None,
                        help="mopd real: every duration (think, teacher call, restore) times "
                             "this (default 1)")
    parser.add_argument("--think-scale", type=float, default=None,
                        help="mopd real: the LLM's generation (think) times also times this "
                             "(default 0.1)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--tag", default="", help="suffix of the output names (variants)")
    return parser


@dataclass(frozen=True)
class Plan:
    """What to run: the points (and the base they vary), the systems, the cost presets."""

    points: list[Point]
    base: Point
    systems: list[str]
    presets: list[str]
    workload: Callable[[Point], Workload]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and write its outputs; returns a process exit code."""
    given = sys.argv[1:] if argv is None else list(argv)
    if given[:1] == ["robustness"]:
        from tangram_celery.bench.robustness import main as robustness_main

        return robustness_main(given[1:])
    args = build_parser().parse_args(given)
    command = "tangram bench " + " ".join(given)
    try:
        plan = resolve(args)
    except ValueError as exc:
        print(f"tangram bench: error: {exc}", file=sys.stderr)
        return 2
    runner = _runner(args)
    results, summaries = _run_all(plan, runner)
    if not results:
        print("tangram bench: error: no system could run at these points (each skip is "
              "printed above); nothing was written", file=sys.stderr)
        return 2
    if args.mode == "real" and args.workload == "mopd":
        plan, results, summaries = _with_measured(args, plan, results)
    by_point = {str(p.as_dict()): p for p in plan.points}
    failures = [(r.system, problem) for r in results
                for problem in violations(plan.workload(by_point[str(r.point)]), r)][:10]
    _write(args, command, plan, results, summaries)
    for name, problem in failures:
        print(f"invariant violated ({name}): {problem}", file=sys.stderr)
    return 1 if failures else 0


def resolve(args: argparse.Namespace) -> Plan:
    """The plan of an invocation; ValueError names what is wrong with the arguments."""
    real = args.mode == "real"
    if real and args.workload not in REAL_WORKLOADS:
        raise ValueError(f"the real-stack mode runs the {' and '.join(REAL_WORKLOADS)} "
                         "workloads")
    gpu_real = real and args.workload == "mopd"
    if (args.time_scale is not None or args.think_scale is not None) and not gpu_real:
        raise ValueError("--time-scale and --think-scale apply to mopd --mode real only")
    if gpu_real and args.sweep in ("cores", "parallel"):
        raise ValueError(f"mopd --mode real sweeps batch or gpus, not {args.sweep}")
    batch, gpus = (8 if real else 1280), 40
    if gpu_real:
        from tangram_celery.bench import mopd_real

        batch, gpus = mopd_real.DEFAULT_BATCH, mopd_real.DEFAULT_GPUS
    for flag in ("batch", "cores", "gpus"):
        given = getattr(args, flag)
        if given is not None and given <= 0:
            raise ValueError(f"--{flag} must be a positive integer, not {given}")
    base = Point(batch=args.batch or batch, cores=args.cores or (8 if real else 1280),
                 gpus=args.gpus or gpus)
    planned = points(base, args.sweep, sweep_values(args.points, args.sweep))
    for point in planned:  # ValueError names a point the cluster cannot have
        if gpu_real:
            _gpu_config(args, point)
        elif not real:
            point.cluster(physics(args))
    default = REAL_GPU_SYSTEMS if gpu_real else REAL_SYSTEMS if real else DEFAULT_SYSTEMS
    systems = [name.strip() for name in args.systems.split(",")] if args.systems else list(
        default)
    for name in systems:
        system(name, args.policy)  # ValueError names an unknown system or policy
    presets = ["real", "sim"] if real else args.costs.split(",")
    unknown = [p for p in presets if p not in PRESETS and not real]
    if unknown:
        raise ValueError(f"unknown cost presets {unknown}; use sched and/or cp")
    if args.workload == "trace" and args.trace is None:
        raise ValueError("give --trace FILE for the trace workload")
    if args.workload == "trace" and args.sweep in ("batch", "parallel"):
        raise ValueError(f"a trace's size and shape are fixed: --sweep {args.sweep} does not "
                         "apply; sweep cores or gpus")
    trace = read_trace(args.trace) if args.workload == "trace" else None

    def workload(point: Point) -> Workload:
        if gpu_real:
            from tangram_celery.bench import mopd_real

            config = _gpu_config(args, point)
            return mopd_real.real_workload(point.batch, args.seed, config.time_scale,
                                           config.think_scale)
        if real:
            from tangram_celery.bench.elastic import real_workload

            return real_workload(point.batch, args.seed, point.cores)
        return workload_at(args.workload, point, args.seed, trace)

    return Plan(planned, base, systems, presets, workload)


def sweep_values(text: str | None, sweep: str | None) -> tuple[float, ...] | None:
    """The values of ``--points`` (None: the sweep's own); ValueError names a bad one."""
    if not text:
        return None
    if sweep is None:
        raise ValueError("--points gives the values of a sweep: add --sweep")
    values = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            raise ValueError(f"--points: {part.strip()!r} is not a number") from None
        if sweep == "parallel" and not 0 <= value <= 1:
            raise ValueError(f"--points: parallel fractions lie in [0, 1], not {part.strip()}")
        if sweep != "parallel" and (value <= 0 or not value.is_integer()):
            raise ValueError(f"--points: {sweep} values are positive integers, not "
                             f"{part.strip()}")
        values.append(value)
    return tuple(values)


def _gpu_config(args: argparse.Namespace, point: Point) -> RealGpuConfig:
    """The emulated hardware of ``mopd --mode real`` at ``point``."""
    from tangram_celery.bench import mopd_real

    given = physics(args)
    scale = mopd_real.DEFAULT_TIME_SCALE if args.time_scale is None else args.time_scale
    think = mopd_real.DEFAULT_THINK_SCALE if args.think_scale is None else args.think_scale
    return mopd_real.RealGpuConfig(
        gpus=point.gpus, time_scale=scale, think_scale=think,
        load_init_s=given.get("load_init_s", Cluster.load_init_s),
        restore_gbps=given.get("restore_gbps", Cluster.restore_gbps))


def _with_measured(args: argparse.Namespace, plan: Plan, results: list[RunResult],
                   ) -> tuple[Plan, list[RunResult], list[Summary]]:
    """``mopd --mode real`` also simulates every system with the restore times its real runs
    measured (preset ``sim-measured``, see :func:`tangram_celery.bench.mopd_real.restore_fit`);
    the plan, results and summaries with those runs, each point's systems in order."""
    from tangram_celery.bench import mopd_real

    added = []
    for point in plan.points:
        here = [r for r in results if r.costs == "real" and r.point == point.as_dict()]
        cluster = _gpu_config(args, point).cluster(mopd_real.restore_fit(here))
        workload = plan.workload(point)
        for real in here:
            run = simulate(workload, real.system, cluster, mopd_real.SIM_COSTS, seed=args.seed,
                           point=point.as_dict(), default_policy=args.policy)
            run.costs = mopd_real.MEASURED
            added.append(run)
    plan = replace(plan, presets=[*plan.presets, mopd_real.MEASURED])
    keys = [str(p.as_dict()) for p in plan.points]

    def rank(run: RunResult) -> tuple[int, int, int]:
        return (keys.index(str(run.point)), plan.systems.index(run.system),
                plan.presets.index(run.costs))

    ordered = sorted([*results, *added], key=rank)
    return plan, ordered, [summarize(r, r.costs) for r in ordered]


def physics(args: argparse.Namespace) -> dict[str, float]:
    """The physical-cost flags given on the command line."""
    given = {"load_init_s": args.load_init_s, "restore_gbps": args.restore_gbps}
    return {k: v for k, v in given.items() if v is not None}


def _runner(args: argparse.Namespace) -> Runner:
    """Runs one system at one point under one preset: simulated, or on the real stack (preset
    ``real``), or simulated on the real stack's single node (preset ``sim`` of the real mode,
    with the control-plane costs) so both orderings can be compared like with like."""

    def run(workload: Workload, system: str, point: Point, preset: str,
            tick: Callable[[int], None]) -> RunResult:
        if args.mode == "real" and args.workload == "mopd":
            from tangram_celery.bench import mopd_real

            config = _gpu_config(args, point)
            if preset == "real":
                return mopd_real.run_real(workload, system, config, point.as_dict(), tick)
            return simulate(workload, system, config.cluster(), mopd_real.SIM_COSTS,
                            seed=args.seed, point=point.as_dict(), progress=tick,
                            default_policy=args.policy)
        if preset == "real":
            from tangram_celery.bench.elastic import run_real

            return run_real(workload, system, point.cores, point.as_dict(), tick)
        if args.mode == "real":
            node = Cluster(cpu_nodes=1, cores_per_node=point.cores, numa_per_node=1)
            return simulate(workload, system, node, PRESETS["cp"], seed=args.seed,
                            point=point.as_dict(), progress=tick, default_policy=args.policy)
        return simulate(workload, system, point.cluster(physics(args)), PRESETS[preset],
                        seed=args.seed, point=point.as_dict(), progress=tick,
                        default_policy=args.policy)

    return run


def _run_all(plan: Plan, runner: Runner) -> tuple[list[RunResult], list[Summary]]:
    """Every system at every point under every preset, with a progress bar."""
    results: list[RunResult] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns) as progress:
        total = len(plan.points) * len(plan.systems) * len(plan.presets)
        overall = progress.add_task("runs", total=total)
        for point in plan.points:
            workload = plan.workload(point)
            for system in plan.systems:
                for preset in plan.presets:
                    result = _run_one(progress, runner, workload, system, point, preset)
                    if result is not None:
                        results.append(result)
                    progress.advance(overall)
    return results, [summarize(r, r.costs) for r in results]


def _run_one(progress: Progress, runner: Runner, workload: Workload, system: str, point: Point,
             preset: str) -> RunResult | None:
    """One run with its own progress bar; None when the system cannot run at this point."""
    label = escape(f"{system} [{preset}] {point.as_dict()}")
    task = progress.add_task(label, total=workload.action_count())

    def tick(done: int) -> None:
        progress.update(task, completed=done)

    try:
        result = runner(workload, system, point, preset, tick)
    except ValueError as exc:
        progress.console.print(f"skipped {label}: {escape(str(exc))}")
        progress.remove_task(task)
        return None
    progress.update(task, completed=len(result.records))
    result.costs = preset
    return result


def _write(args: argparse.Namespace, command: str, plan: Plan, results: list[RunResult],
           summaries: list[Summary]) -> None:
    name = "-".join(part for part in (args.workload, args.mode, args.sweep, args.tag) if part)
    folder = args.out / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.actions.json").write_text(json.dumps(actions_json(results)))
    (folder / f"{name}.json").write_text(json.dumps([asdict(s) for s in summaries], indent=1))
    chosen = headline(plan.points, plan.base, args.sweep).as_dict()
    top = [s for s in summaries if s.point == chosen]
    plotted = _plots(folder, name, args.sweep, plan.presets, results, summaries, chosen)
    setup = _setup(args, plan.points, results)
    notes = _notes(args, plan, summaries, results)
    text = section(Section(name, command, setup, tuple(plan.presets), args.sweep, top,
                           summaries, plotted, notes))
    (folder / f"{name}.md").write_text(text + "\n")
    sections = {path.stem: path.read_text() for path in sorted(folder.glob("*.md"))}
    (args.out / "results.md").write_text(index(sections))
    readme = args.out.parent / "README.md"
    if readme.is_file() and write_readme(readme, folder):
        print(f"updated the results block of {readme}", file=sys.stderr)
    print(text)


def _notes(args: argparse.Namespace, plan: Plan, summaries: list[Summary],
           results: list[RunResult]) -> tuple[str, ...]:
    if args.mode == "real" and args.workload == "mopd":
        from tangram_celery.bench.mopd_real import report_notes

        return report_notes(_gpu_config(args, plan.base), summaries, results)
    if args.sweep == "gpus":
        return tuple(gpu_parity(summaries, preset) for preset in plan.presets)
    if args.mode == "real":
        return ("*simulated, same workload and node*: the simulator on one node of the same "
                "cores, the same seeded workload, with the control-plane costs (tangram's "
                "measured per-action dispatch cost), to compare the orderings like with like.",)
    return ()


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
    made["ACT CDF"] = f"bench/{cdf.name}"
    bars = folder / f"{name}-breakdown.png"
    plots.breakdown([s for s in summaries if s.point == chosen and s.costs == first], bars,
                    f"{name}: ACT breakdown ({first})")
    made["ACT breakdown"] = f"bench/{bars.name}"
    if sweep:
        line = folder / f"{name}-sweep.png"
        plots.sweep([s for s in summaries if s.costs == first], sweep, line,
                    f"{name}: against {sweep} ({first})")
        made[f"ACT against {sweep}"] = f"bench/{line.name}"
    return made


def _setup(args: argparse.Namespace, all_points: list[Point],
           results: list[RunResult]) -> str:
    wall = sum(r.wall_s for r in results)
    if args.mode == "real" and args.workload == "mopd":
        from tangram_celery.bench.mopd_real import setup_text

        return setup_text(_gpu_config(args, all_points[0]), all_points, args.seed, results)
    if args.mode == "real":
        return (f"Real stack on this machine: one CPU node worker with {all_points[0].cores} "
                "emulated cores (units are real exclusive allocations; work is emulated by "
                f"sleeping T1/S(m)), Celery + Redis + bubblewrap sandboxes; seed {args.seed}; "
                f"{len(results)} runs in {wall:.0f} s.")
    cluster = all_points[0].cluster(physics(args))
    rows = "\n".join(f"| {flag} | {value} | {source} |"
                     for flag, value, source in cluster.physics())
    return (f"Simulated: CPU nodes of 256 cores, GPU nodes of 8 x 80 GB GPUs; workload "
            f"`{args.workload}`, seed {args.seed}; points "
            f"{[p.as_dict() for p in all_points]}; {len(results)} runs in {wall:.0f} s of "
            "simulation wall time on this machine.\n\nPhysical costs (charged in every "
            "preset):\n\n| flag | value | source |\n| --- | --- | --- |\n" + rows)


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


if __name__ == "__main__":
    sys.exit(main())
