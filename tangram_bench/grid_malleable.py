"""Malleable test runs on the robustness grid: the weightings compared, the grid's targets,
and one unseen seed (issue 32).

    tangram bench robustness --weightings --scale 4 --out docs   # choose the weighting
    tangram bench robustness --grid --scale 4 --out docs         # the grid, with its targets
    tangram bench robustness --unseen 7 --out docs               # batch 512 on 512 cores

``--grow-cost`` and ``--takeback`` set the resize costs of the simulated malleable runs
(:class:`~tangram_bench.sim.malleable.MalleableKnobs`; defaults measured by ``tangram bench
malleable``); every section prints them with their sources.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace

from tangram_bench import grid, grid_targets
from tangram_bench.grid import FIXED, MALLEABLE, STATIC, GridPoint, Measured
from tangram_bench.malleable_flags import add_knob_arguments, knobs
from tangram_bench.report import publish
from tangram_bench.sim.malleable import MalleableKnobs, knob_rows
from tangram_bench.sim.systems import MALLEABLE_WEIGHTING
from tangram_bench.workloads import CodingParams
from tangram_celery.scheduling.malleable import WEIGHTINGS

WEIGHTINGS_SECTION = "coding-sim-malleable-weightings"
UNSEEN_SECTION = "coding-sim-unseen-seed"
WEIGHTING_POINTS = (0, 1, 2, 21, 22, 23)
"""The grid points (indices of :func:`grid.grid_points`) the weightings are compared on: both
ends of the grid, at every batch."""
UNSEEN_BATCH = 512


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of the malleable runs' sections."""
    add_knob_arguments(parser)
    parser.add_argument("--weightings", action="store_true",
                        help="compare the malleable runs' weightings on a few grid points")
    parser.add_argument("--unseen", type=int, default=None, metavar="SEED",
                        help=f"run one seed at batch {UNSEEN_BATCH} on {UNSEEN_BATCH} cores")
    parser.add_argument("--points", default="",
                        help="grid: comma-separated point indices to run (default: all)")


def chosen_points(points: Sequence[GridPoint], indices: str) -> list[GridPoint]:
    """The points of ``indices`` (comma-separated; empty: all)."""
    picked = [int(i) for i in indices.split(",") if i.strip()]
    return [points[i] for i in picked] if picked else list(points)


def knob_table(chosen: MalleableKnobs) -> str:
    """The resize costs as a costs table."""
    lines = ["| flag | value | source |", "| --- | --- | --- |"]
    lines += [f"| {flag} | {value} | {source} |" for flag, value, source in knob_rows(chosen)]
    return "\n".join(lines)


def part(points: Sequence[GridPoint], seeds: Sequence[int], args: argparse.Namespace,
         found: Mapping[tuple[GridPoint, int], Mapping[str, Measured]]) -> str:
    """The grid section's part on ``tangram:malleable`` and its targets."""
    rows = [grid_targets.target_row(p, [found[(grid.scaled(p, args.scale), s)] for s in seeds])
            for p in points]
    return "\n".join([
        f"### Malleable test runs ({MALLEABLE}, weighting {MALLEABLE_WEIGHTING})", "",
        "Resize costs of the simulated malleable runs:", "", knob_table(knobs(args)), "",
        grid_targets.render(rows), "", grid_targets.summary(rows), ""])


def _weighing(args: argparse.Namespace, seeds: Sequence[int]) -> tuple[str, str]:
    group = CodingParams().group if args.group is None else args.group
    points = [replace(grid.grid_points()[i], group=group) for i in WEIGHTING_POINTS]
    systems = [f"{MALLEABLE}:{w}" for w in WEIGHTINGS]
    found = grid.run_grid(points, seeds, args.scale, args.durations, args.jobs,
                          lambda: print(".", end="", file=sys.stderr, flush=True),
                          (*systems, *FIXED, STATIC), knobs(args))
    lines = ["| weighting | points meeting every target | median best fixed / it (ext.) | "
             "mean best fixed / it (ext.) | mean best fixed / it (step) | least exec static / it"
             " | mean core-s |", "| --- | --- | --- | --- | --- | --- | --- |"]
    tables, ranks = [], {}
    for system in systems:
        rows = [grid_targets.target_row(p, [found[(grid.scaled(p, args.scale), s)]
                                            for s in seeds], system) for p in points]
        met = sum(not r.misses for r in rows)
        ext = [r.vs_fixed.mean for r in rows]
        ranks[system] = (met, statistics.median(ext), statistics.fmean(
            r.step_vs_fixed.mean for r in rows))
        lines.append(f"| {system} | {met} of {len(rows)} | {statistics.median(ext):.3f}x | "
                     f"{statistics.fmean(ext):.3f}x | "
                     f"{statistics.fmean(r.step_vs_fixed.mean for r in rows):.3f}x | "
                     f"{min(r.exec_vs_static.mean for r in rows):.4f}x | "
                     f"{statistics.fmean(r.core_s.mean for r in rows):.0f} |")
        tables += [f"#### {system}", "", grid_targets.render(rows), ""]
    best = max(ranks, key=lambda name: ranks[name])
    verdict = (f"Best by this measurement (most points meeting every target, then the median, "
               f"then the mean step ratio): `{best}`. `{MALLEABLE}` runs the weighting "
               f"`{MALLEABLE_WEIGHTING}`.")
    setup = (f"The weightings of malleable test runs' resize decisions, on grid points "
             f"{', '.join(p.label for p in points)}; {args.durations} durations, seeds "
             f"{','.join(map(str, seeds))}, scale 1/{args.scale}; each against the best fixed "
             f"DoP of {{1, 2, 4, 8, 16, 32}} at its point and against static.")
    text = "\n".join([setup, "", "Resize costs:", "", knob_table(knobs(args)), "", *lines, "",
                      verdict, "", *tables])
    return setup, text


def _unseen(args: argparse.Namespace) -> tuple[str, str]:
    group = CodingParams().group if args.group is None else args.group
    base = replace(grid.grid_points()[0], batch=UNSEEN_BATCH, group=group)
    seeds = [args.unseen]
    found = grid.run_grid([base], seeds, args.scale, args.durations, args.jobs,
                          lambda: print(".", end="", file=sys.stderr, flush=True),
                          (grid.TANGRAM, MALLEABLE, *FIXED, STATIC), knobs(args),
                          UNSEEN_BATCH)
    runs = [found[(grid.scaled(base, args.scale), s)] for s in seeds]
    rows = [grid_targets.target_row(base, runs, system) for system in (MALLEABLE, grid.TANGRAM)]
    point = grid.scaled(base, args.scale)
    setup = (f"An unseen seed ({args.unseen}): batch {point.batch} on "
             f"{point.batch} cores ({point.batch // (grid.NODE_CORES // args.scale)} nodes of "
             f"{grid.NODE_CORES // args.scale}), reward median {base.reward_s:g} s, turns "
             f"U{base.turns}, parallel U{base.parallel}, {args.durations} durations. "
             f"{MALLEABLE} (weighting {MALLEABLE_WEIGHTING}) and tangram's robust policy, "
             "each against the best fixed DoP of {1, 2, 4, 8, 16, 32} and static.")
    text = "\n".join([setup, "", "Resize costs:", "", knob_table(knobs(args)), "",
                      *(grid_targets.render([row]) + "\n\n" + grid_targets.summary([row])
                        + "\n" for row in rows)])
    return setup, text


def main(args: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    """``--weightings`` or ``--unseen``: run, print, and with ``--out`` publish."""
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    name = UNSEEN_SECTION if args.unseen is not None else WEIGHTINGS_SECTION
    _, text = _unseen(args) if args.unseen is not None else _weighing(args, seeds)
    print(file=sys.stderr)
    print(text)
    if args.out is not None:
        command = "tangram bench robustness " + " ".join(sys.argv[1:] if argv is None else argv)
        publish(args.out, name, "\n".join([f"## {name}", "", f"Command: `{command}`", "",
                                           text.rstrip("\n")]))
    return 0
