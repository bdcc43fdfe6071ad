"""The robustness grid of ``tangram bench robustness --grid`` (issue 20).

Every combination of the AI-coding workload's reward (test run) median duration {20, 60} s,
turns {U(8,24), U(10,40)}, parallel fraction {U(0.5,0.99), U(0.3,0.9)} and batch {256, 1280,
2048}, at 1280 cores (256 a node), three seeds each, pure CPU scheduling. Per point, the mean
over seeds (and the range) of: external time per trajectory of tangram, the paper's allocator
and the best fixed DoP (1, 2, 4, 8, 16, 32; the one with the least mean over the seeds), tangram /
best fixed DoP (>= 1: tangram ahead), RL step time against static pods, and exec actions'
ACT against static (>= 1: never slower); the same for ``tangram:malleable`` against the
issue's targets in :mod:`tangram_bench.grid_targets`. Each (point, seed) is one task;
``--jobs`` runs them in that many processes (each simulates every system of its point, one
after another).
"""

from __future__ import annotations

import itertools
import multiprocessing
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tangram_bench.sim.cluster import Cluster
from tangram_bench.sim.costs import SCHEDULING_ONLY
from tangram_bench.sim.durations import parse_durations
from tangram_bench.sim.malleable import MalleableKnobs
from tangram_bench.sim.systems import simulate
from tangram_bench.summary import summarize
from tangram_bench.workloads import CodingParams, coding

TANGRAM, PAPER, STATIC = "tangram", "tangram:ersa", "static"
MALLEABLE = "tangram:malleable"
FIXED = ("fixed-dop-1", "fixed-dop-2", "fixed-dop-4", "fixed-dop-8", "fixed-dop-16",
         "fixed-dop-32")
SYSTEMS = (TANGRAM, PAPER, MALLEABLE, *FIXED, STATIC)
BOUND = "no-queue bound"
"""The key of the point's no-queue bound (`Workload.unqueued_external_s`) among its runs."""
REWARD_S = (20.0, 60.0)
TURNS = ((8, 24), (10, 40))
PARALLEL = ((0.5, 0.99), (0.3, 0.9))
BATCHES = (256, 1280, 2048)
CORES, NODE_CORES = 1280, 256
SEEDS = (1, 2, 3)
MAX_UNITS = 32
"""A test run's most cores (fewer on a node scaled below it)."""


@dataclass(frozen=True)
class GridPoint:
    """One point of the grid."""

    reward_s: float
    turns: tuple[int, int]
    parallel: tuple[float, float]
    batch: int
    group: int = CodingParams().group
    """GRPO group size G."""

    def params(self) -> CodingParams:
        """The workload's knobs at this point."""
        return replace(CodingParams(), test_median_s=self.reward_s, turns=self.turns,
                       parallel_range=self.parallel, group=self.group)

    @property
    def label(self) -> str:
        """How the point is written in the table."""
        return (f"{self.reward_s:g} s, U{self.turns}, U{self.parallel}, {self.batch}"
                .replace(" ", "").replace(",", ", "))


@dataclass(frozen=True)
class Measured:
    """One system at one (point, seed): external time per trajectory, mean step time, exec
    actions' mean ACT, test runs' DoP quartiles (p10, p50, p90)."""

    external: float
    step: float
    exec: float
    dop: tuple[int, int, int]
    core_s: float = 0.0
    """Core-seconds reserved (held) by all actions."""


def grid_points() -> list[GridPoint]:
    """Every point, reward duration outermost, batch innermost."""
    return [GridPoint(r, t, p, b) for r, t, p, b in
            itertools.product(REWARD_S, TURNS, PARALLEL, BATCHES)]


def scaled(point: GridPoint, scale: int) -> GridPoint:
    """The point with its batch divided by ``scale`` (cores and node size follow in
    :func:`run_task`)."""
    return replace(point, batch=max(point.batch // scale, 1))


Task = tuple[GridPoint, int, int, str, tuple[str, ...], MalleableKnobs, int]
"""(point, seed, scale, durations mode, systems, resize knobs, cores before scaling)."""


def run_task(task: Task) -> dict[str, Measured]:
    """Every system at one point and seed."""
    point, seed, scale, mode, systems, knobs, cores = task
    node = NODE_CORES // scale
    workload = coding(point.batch, seed, replace(point.params(),
                                                 max_units=min(MAX_UNITS, node)))
    cluster = Cluster(cpu_nodes=cores // NODE_CORES, cores_per_node=node)
    durations = parse_durations(mode)
    measured = {}
    for name in systems:
        result = simulate(workload, name, cluster, SCHEDULING_ONLY, seed=seed,
                          durations=durations, knobs=knobs)
        summary = summarize(result, "sched")
        execs = summary.kind("exec")
        dops = sorted(r.units for r in result.records if r.kind == "test_run")
        measured[name] = Measured(summary.external, summary.step,
                                  execs.mean if execs else 0.0, _quantiles(dops),
                                  summary.reserved)
    step = max((t.start_s + sum(a.think_s + a.duration(max(a.units)) for a in t.actions)
                for t in workload.trajectories), default=0.0)
    measured[BOUND] = Measured(workload.unqueued_external_s() or 0.0, step, 0.0, (0, 0, 0))
    return measured


def _quantiles(values: Sequence[int]) -> tuple[int, int, int]:
    if not values:
        return (0, 0, 0)
    at = [values[int(q * (len(values) - 1))] for q in (0.1, 0.5, 0.9)]
    return (at[0], at[1], at[2])


def run_grid(points: Sequence[GridPoint], seeds: Sequence[int], scale: int, mode: str,
             jobs: int, tick: Callable[[], None], systems: Sequence[str] = SYSTEMS,
             knobs: MalleableKnobs | None = None, cores: int = CORES
             ) -> dict[tuple[GridPoint, int], dict[str, Measured]]:
    """Every (point, seed), in ``jobs`` processes (1: in this one); ``cores`` before
    scaling."""
    tasks: list[Task] = [(scaled(p, scale), s, scale, mode, tuple(systems),
                          knobs or MalleableKnobs(), cores)
                         for p in points for s in seeds]
    found: dict[tuple[GridPoint, int], dict[str, Measured]] = {}
    if jobs <= 1:
        for task in tasks:
            found[(task[0], task[1])] = run_task(task)
            tick()
        return found
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        for task, measured in zip(tasks, pool.imap(run_task, tasks), strict=True):
            found[(task[0], task[1])] = measured
            tick()
    return found


@dataclass(frozen=True)
class Spread:
    """The mean of a figure over seeds and its range."""

    mean: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        """Mean, least and most of ``values``."""
        return cls(statistics.fmean(values), min(values), max(values))

    def cell(self, digits: int = 2, suffix: str = "") -> str:
        """``mean (low-high)``."""
        return (f"{self.mean:.{digits}f}{suffix} ({self.low:.{digits}f}-"
                f"{self.high:.{digits}f})")


@dataclass(frozen=True)
class GridRow:
    """One point over its seeds."""

    point: GridPoint
    tangram: Spread
    paper: Spread
    best_fixed: str
    fixed: Spread
    vs_fixed: Spread
    step_vs_static: Spread
    exec_vs_static: Spread
    dop_tangram: tuple[int, int, int]
    dop_paper: tuple[int, int, int]
    ceiling: Spread
    """The best fixed DoP's external time over the no-queue bound: no scheduler can be
    further ahead of it."""


def grid_row(point: GridPoint, runs: Sequence[dict[str, Measured]]) -> GridRow:
    """A point's row from its seeds' runs."""
    best = min(FIXED, key=lambda name: statistics.fmean(r[name].external for r in runs))
    return GridRow(
        point,
        Spread.of([r[TANGRAM].external for r in runs]),
        Spread.of([r[PAPER].external for r in runs]),
        best,
        Spread.of([r[best].external for r in runs]),
        Spread.of([r[best].external / r[TANGRAM].external for r in runs]),
        Spread.of([r[STATIC].step / r[TANGRAM].step for r in runs]),
        Spread.of([r[STATIC].exec / r[TANGRAM].exec for r in runs]),
        runs[0][TANGRAM].dop,
        runs[0][PAPER].dop,
        Spread.of([r[best].external / r[BOUND].external for r in runs]),
    )


def render_grid(rows: Sequence[GridRow]) -> str:
    """The grid as Markdown; a ratio below its target is marked ``(miss)``."""
    head = ["reward median, turns, parallel, batch", "ext. tangram (s)", "ext. tangram:ersa (s)",
            "best fixed DoP", "ext. best fixed (s)", "best fixed / tangram",
            "best fixed / no-queue bound", "step static / tangram", "exec static / tangram",
            "test DoP p10/p50/p90 tangram", "same, tangram:ersa"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in rows:
        lines.append("| " + " | ".join([
            row.point.label, row.tangram.cell(), row.paper.cell(), row.best_fixed,
            row.fixed.cell(), _target(row.vs_fixed, 1.0), row.ceiling.cell(3, "x"),
            row.step_vs_static.cell(suffix="x"),
            _target(row.exec_vs_static, 1.0), "/".join(map(str, row.dop_tangram)),
            "/".join(map(str, row.dop_paper))]) + " |")
    return "\n".join(lines)


def _target(spread: Spread, target: float) -> str:
    return spread.cell(3, "x") + ("" if spread.mean >= target else " (miss)")


SECTION = "coding-sim-grid"
"""The report section ``--grid --out`` writes (``<out>/bench/coding-sim-grid.md``)."""


def headline_table(rows: Sequence[GridRow]) -> list[str]:
    """The ratios at batch 1280 of the first point (20 s, U(8,24), U(0.5,0.99)) in the report's
    headline format, so the README's results block can quote them."""
    row = next(r for r in rows if r.point.batch == 1280)
    return [
        "| baseline | metric | ratio: mean (range) of the seeds |",
        "| --- | --- | --- |",
        f"| {row.best_fixed} (best fixed DoP) | external time per trajectory | "
        f"{row.vs_fixed.cell(2, 'x')} |",
        f"| {row.best_fixed}, against the no-queue bound (the most any scheduler could gain) "
        f"| external time per trajectory | {row.ceiling.cell(2, 'x')} |",
        f"| static | makespan / step time | {row.step_vs_static.cell(2, 'x')} |",
        f"| static | exec ACT | {row.exec_vs_static.cell(2, 'x')} |",
    ]


def section_text(command: str, setup: str, rows: Sequence[GridRow], summary: str,
                 scale: int = 1) -> str:
    """The report section of a grid run (at 1 / ``scale`` of its sizes)."""
    first = rows[0].point
    size = 1280 // scale
    shrunk = f" (1/{scale} of 1280 on 1280)" if scale > 1 else ""
    where = (f"batch {size}, cores {size}{shrunk}, reward {first.reward_s:g} s, "
             f"turns U{first.turns}, parallel U{first.parallel}")
    return "\n".join([
        f"## {SECTION}", "", f"Command: `{command}`", "", setup, "",
        f"### Headline ratios ({where})", "", *headline_table(rows), "",
        "### The grid", "", render_grid(rows), "", summary, ""])
