"""``tangram bench robustness``: tangram's scheduler against the paper's and every fixed DoP.

    tangram bench robustness                      # paper scale, batch and cores sweeps
    tangram bench robustness --scale 4            # a quarter of every size (quick)
    tangram bench robustness --ablations          # also the robust policy minus each idea
    tangram bench robustness --grid [--jobs 2]    # the robustness grid, 3 seeds (bench.grid)
    tangram bench robustness --weightings         # malleable runs' weightings on grid points
    tangram bench robustness --unseen 7           # one unseen seed at batch 512 on 512 cores
    tangram bench robustness --durations oracle   # what the policies see (default: learned)

The AI-coding workload in simulation, pure CPU scheduling (no control-plane costs), at every
point of the batch sweep (cores 1280) and of the cores sweep (batch 1280) of ``tangram bench
--sweep``: mean ACT of ``tangram`` (the robust policy) against ``tangram:ersa`` (the paper's
allocator), fixed DoP 4, 8 and 16 and static per-trajectory pods, with the ratio to the best
of the paper's and the fixed DoPs (<= 1: never worse); exec actions' ACT against static (>= 1:
never slower) and how many of tangram's exec actions queued at all; and external time per
trajectory against static, next to the ideal ratio (every action at its largest allowed count,
no queueing), which bounds what any scheduler can reach. A ratio within ``EQUAL`` of its target
counts as met: the same ACTs summed in another order differ in their last bits.
``--scale k`` divides the batch, the cores and each node's cores by k (nodes stay 256 / k cores).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from tangram_bench import grid, grid_malleable
from tangram_bench.malleable_flags import knobs
from tangram_bench.plan import SWEEPS, Point, workload_at
from tangram_bench.report import publish
from tangram_bench.sim.costs import SCHEDULING_ONLY
from tangram_bench.sim.durations import DEFAULT_DURATIONS, DurationMode, parse_durations
from tangram_bench.sim.policy import ABLATIONS
from tangram_bench.sim.systems import simulate
from tangram_bench.summary import ALL, summarize
from tangram_bench.workloads import CodingParams, Workload

TANGRAM = "tangram"
PAPER = "tangram:ersa"
FIXED = ("fixed-dop-4", "fixed-dop-8", "fixed-dop-16")
STATIC = "static"
SYSTEMS = (TANGRAM, PAPER, *FIXED, STATIC)
NODE_CORES = 256
EQUAL = 1e-9
"""Relative difference below which two means count as equal (floating-point summation)."""


@dataclass(frozen=True)
class Row:
    """One sweep point: mean and exec ACT per system, how many exec actions queued at all,
    external time per trajectory."""

    sweep: str
    batch: int
    cores: int
    mean: dict[str, float]
    exec: dict[str, float]
    external: dict[str, float]
    ideal_external: float
    exec_queued: dict[str, int] = field(default_factory=dict)

    @property
    def best_rival(self) -> tuple[str, float]:
        """The best of the paper's allocator and the fixed DoPs by mean ACT."""
        rivals = {name: self.mean[name] for name in (PAPER, *FIXED) if name in self.mean}
        name = min(rivals, key=rivals.__getitem__)
        return name, rivals[name]

    def ratio(self, name: str = TANGRAM) -> float:
        """``name``'s mean ACT over the best rival's (<= 1: at least as good)."""
        return self.mean[name] / self.best_rival[1]


def sweep_points(scale: int, group: int | None = None) -> list[tuple[str, Point]]:
    """The batch sweep at 1280 cores, then the cores sweep at batch 1280, divided by ``scale``
    (``group``: the GRPO group size, None for the workload's default)."""
    base = Point(group=group)
    found = [("batch", replace(base, batch=int(v))) for v in SWEEPS["batch"]]
    found += [("cores", replace(base, cores=int(v))) for v in SWEEPS["cores"]
              if int(v) != base.cores]
    return [(sweep, replace(p, batch=p.batch // scale, cores=p.cores // scale))
            for sweep, p in found]


def ideal_external(workload: Workload) -> float:
    """External time per trajectory if every action ran at its largest count, never queued."""
    total = sum(a.duration(a.units[-1]) for t in workload.trajectories for a in t.actions)
    return total / len(workload.trajectories)


def run_point(sweep: str, point: Point, systems: Sequence[str], seed: int, scale: int,
              tick: Callable[[str], None], durations: DurationMode | None = None) -> Row:
    """Every system at one point (policies see ``durations``: default learned)."""
    workload = workload_at("coding", point, seed)
    cluster = point.cluster(cores_per_node=NODE_CORES // scale)
    mean, exec_act, external, queued = {}, {}, {}, {}
    for name in systems:
        result = simulate(workload, name, cluster, SCHEDULING_ONLY, seed=seed,
                          point=point.as_dict(), durations=durations)
        summary = summarize(result, "sched")
        kinds = {k.kind: k for k in summary.kinds}
        mean[name], exec_act[name] = kinds[ALL].mean, kinds["exec"].mean
        external[name] = summary.external
        queued[name] = sum(r.queue > 0 for r in result.records if r.kind == "exec")
        tick(name)
    return Row(sweep, point.batch, point.cores, mean, exec_act, external,
               ideal_external(workload), queued)


def render(rows: Sequence[Row], systems: Sequence[str]) -> str:
    """The comparison table as Markdown: mean ACT per system, the ratios, exec ACT, external
    time; each extra system (an ablation) with its ratio to the best rival and its exec ACT."""
    extra = [s for s in systems if s not in SYSTEMS]
    head = ["sweep", "batch", "cores", *systems, "best rival", "tangram / best",
            "exec tangram", "exec static", "exec static / tangram", "exec queued (tangram)",
            *(f"{s}: / best, exec static / it" for s in extra),
            "ext. static / tangram", "ideal static / ideal"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in rows:
        rival, _ = row.best_rival
        cells = [row.sweep, str(row.batch), str(row.cores),
                 *(f"{row.mean[s]:.3f}" for s in systems), rival, _mark(row.ratio(), 1.0),
                 f"{row.exec[TANGRAM]:.4f}", f"{row.exec[STATIC]:.4f}",
                 _mark(row.exec[STATIC] / row.exec[TANGRAM], 1.0, higher=True),
                 str(row.exec_queued.get(TANGRAM, "")),
                 *(f"{row.ratio(s):.3f}, {row.exec[STATIC] / row.exec[s]:.4f}" for s in extra),
                 f"{row.external[STATIC] / row.external[TANGRAM]:.2f}x",
                 f"{row.external[STATIC] / row.ideal_external:.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _mark(value: float, target: float, higher: bool = False) -> str:
    met = value >= target * (1 - EQUAL) if higher else value <= target * (1 + EQUAL)
    return f"{value:.4f}" + ("" if met else " (miss)")


def headline(rows: Sequence[Row]) -> str:
    """External time per trajectory where batch equals cores (1280 at paper scale) vs static."""
    lines = []
    for row in rows:
        if row.sweep != "batch" or row.batch != row.cores:
            continue
        ratio = row.external[STATIC] / row.external[TANGRAM]
        bound = row.external[STATIC] / row.ideal_external
        lines.append(
            f"External time per trajectory, batch {row.batch} on {row.cores} cores, pure CPU "
            f"scheduling: tangram {row.external[TANGRAM]:.2f} s, static "
            f"{row.external[STATIC]:.2f} s: {ratio:.2f}x (target >= 2x). The ideal (every "
            f"action at its largest count, no queueing) takes {row.ideal_external:.2f} s, so "
            f"no scheduler can beat static by more than {bound:.2f}x on this workload.")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The arguments of ``tangram bench robustness``."""
    parser = argparse.ArgumentParser(prog="tangram bench robustness", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=int, default=1, choices=(1, 2, 4, 8, 16),
                        help="divide batch, cores and node size by this (1: paper scale)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sweep", choices=("batch", "cores", "both"), default="both")
    parser.add_argument("--ablations", action="store_true",
                        help="also run the robust policy with each idea switched off")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument("--grid", action="store_true",
                        help="run the robustness grid (see tangram_bench.grid) instead")
    parser.add_argument("--seeds", default="1,2,3", help="grid: comma-separated seeds")
    parser.add_argument("--out", type=Path, default=None,
                        help="grid: write the section under OUT/bench and rebuild "
                             "OUT/results.md and the README's results block (e.g. docs)")
    parser.add_argument("--jobs", type=int, default=1, help="grid: processes to run it in")
    parser.add_argument("--durations", default=DEFAULT_DURATIONS,
                        help="what the policies are told: learned (default), oracle or "
                             "noisy:SIGMA")
    grid_malleable.add_arguments(parser)
    parser.add_argument("--group", type=int, default=None,
                        help="GRPO group size G: rollouts per prompt sharing one test suite "
                             "(default 8, TRL's num_generations; 1: every rollout its own)")
    return parser


def grid_main(args: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    """Run the grid and print it."""
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    group = CodingParams().group if args.group is None else args.group
    points = [replace(p, group=group) for p in grid.grid_points()]
    points = grid_malleable.chosen_points(points, args.points)
    found = grid.run_grid(points, seeds, args.scale, args.durations, args.jobs,
                          lambda: print(".", end="", file=sys.stderr, flush=True),
                          knobs=knobs(args))
    print(file=sys.stderr)
    rows = [grid.grid_row(p, [found[(grid.scaled(p, args.scale), s)] for s in seeds])
            for p in points]
    setup = (f"Robustness grid: AI coding, simulated, pure CPU scheduling, {args.durations} "
             f"durations, GRPO groups of {group}, seeds "
             f"{','.join(map(str, seeds))}, scale 1/{args.scale} (batch, cores and node size "
             "divided by it): external time per trajectory, mean (range) over seeds.")
    misses = [r.point.label for r in rows if r.vs_fixed.mean < 1.0 or r.exec_vs_static.mean < 1.0]
    summary = (f"{len(rows) - len(misses)} of {len(rows)} points meet tangram >= best fixed "
               f"DoP and exec ACT <= static; short: {'; '.join(misses) or 'none'}.")
    malleable = grid_malleable.part(points, seeds, args, found)
    print(setup + "\n")
    print(grid.render_grid(rows))
    print("\n" + summary)
    print(malleable)
    if args.out is not None:
        command = "tangram bench robustness " + " ".join(sys.argv[1:] if argv is None else argv)
        publish(args.out, grid.SECTION,
                grid.section_text(command, setup, rows, summary, args.scale).removesuffix("\n")
                + "\n\n" + malleable)
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(row) for row in rows], indent=1))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sweeps and print the table."""
    args = build_parser().parse_args(argv)
    try:
        parse_durations(args.durations)
        if args.group is not None and args.group < 1:
            raise ValueError(f"--group must be a positive integer, not {args.group}")
    except ValueError as exc:
        print(f"tangram bench robustness: error: {exc}", file=sys.stderr)
        return 2
    if args.weightings or args.unseen is not None:
        return grid_malleable.main(args, argv)
    if args.grid:
        return grid_main(args, argv)
    systems = [*SYSTEMS, *(f"tangram:{name}" for name in ABLATIONS if args.ablations)]
    chosen = [(s, p) for s, p in sweep_points(args.scale, args.group)
              if args.sweep in (s, "both")]
    rows = []
    for sweep, point in chosen:
        rows.append(run_point(sweep, point, systems, args.seed, args.scale,
                              lambda name: print(".", end="", file=sys.stderr, flush=True),
                              parse_durations(args.durations)))
        print(f" {sweep} batch {point.batch} cores {point.cores}", file=sys.stderr)
    print(f"AI-coding workload, simulated, pure CPU scheduling, seed {args.seed}, scale 1/"
          f"{args.scale}: mean ACT (s) per system\n")
    print(render(rows, systems))
    print()
    print(headline(rows))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(row) for row in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
