"""Resize decisions for malleable test runs: which running runs grow or shrink, which waiting
actions start. Pure: plain data in, a `ResizeDecision` out.

A malleable run's workers pull test ids from one queue, so cores can join it and leave it while
it runs (`tangram_celery.sandbox.malleable`). At each event (an action arrives or ends, a run
reports progress) `decide_resize` takes the free cores, the running malleable runs and the
waiting actions, and decides:

* **Waiting actions first, in arrival order** (with `ResizeConfig.others_first`, those that are
  not malleable runs before those that are). Each starts on free cores; when too few are
  free it takes cores back from malleable runs at once (a run keeps at least one worker),
  each time from the run that loses least by it. An action that cannot start even so waits,
  and so does every action behind it (no backfilling, as the pool's own queue).
* **Then every free core goes to a run that gains from it**, one core at a time to the run
  the weighting ranks first, until no run gains or only the node's `ResizeInputs.reserve` is
  left. A run given cores back in this decision does not grow in it.
* **Then, with `ResizeConfig.move_gain`, cores move between runs** while the run the
  weighting grows first saves more seconds than the run it shrinks first loses.

Remaining work, in core-seconds: the run's learned single-core duration times the share of its
tests not yet done (`expected_core_s`); without a learned duration, the core-seconds spent so
far times the tests left over the tests done; unknown before the first test ends. ``k`` workers
go through it at rate ``r(k) = 1 / ((1 - p) + p / k)`` (Amdahl's law over the run's learned
parallel fraction ``p``, `MalleableRun.parallel`; 1: linear), so remaining work ``W`` takes
``W / r(k)``. A new worker starts after ``s`` seconds (`ResizeConfig.worker_start_s`: the
measured start and collection cost) while the ``k`` go on, so the run ends at
``s + (W - r(k) s) / r(k + 1)`` instead of ``W / r(k)``; the gain is the difference (nothing
when it is not positive, when no test is left for the new worker, or when the run is at its
most workers). Taking one of ``k`` workers costs ``W / r(k - 1) - W / r(k)``. The `weighting`
chooses among the runs that gain:

* ``absolute`` grows the run that saves most seconds and shrinks the one that loses fewest
  (in effect long runs first);
* ``shortest`` grows the run with the least remaining time ``W / r(k)`` and shrinks the one
  with the most (short runs first, in the spirit of heSRPT and SRPT: a run that ends early
  hands all its cores on);
* ``relative`` grows the run that saves the largest share of its remaining time and shrinks
  the one that loses the least share;
* ``equi`` grows the run with the fewest workers and shrinks the one with the most (EQUI:
  an even split), ties by ``absolute``.

A run whose remaining work is unknown grows only onto cores no run with a known gain wants,
and gives cores back first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Weighting = Literal["absolute", "shortest", "relative", "equi"]
WEIGHTINGS: tuple[Weighting, ...] = ("absolute", "shortest", "relative", "equi")


@dataclass(frozen=True)
class MalleableRun:
    """A running malleable test run: its workers that take tests (retiring ones not counted),
    its tests (0 while its first worker collects), the tests done, the core-seconds its workers
    spent so far, and its signature's learned single-core duration (None when not learned);
    its learned parallel fraction (1: linear speed-up among workers) and its most workers
    (None: no bound but its tests)."""

    run_id: str
    workers: int
    tests: int
    done: int
    core_s_spent: float = 0.0
    expected_core_s: float | None = None
    parallel: float = 1.0
    max_workers: int | None = None
    starting: bool = False
    """Started in this decision: a worker added now starts with its first, at no extra cost."""

    def __post_init__(self) -> None:
        if self.workers < 1 or self.done < 0 or self.tests < 0 or self.done > self.tests:
            raise ValueError(f"{self.run_id}: needs workers >= 1 and 0 <= done <= tests")
        if not 0.0 <= self.parallel <= 1.0 or (self.max_workers is not None
                                                and self.max_workers < 1):
            raise ValueError(f"{self.run_id}: needs a parallel fraction in [0, 1] and "
                             "max_workers >= 1")

    def rate(self, workers: int) -> float:
        """Single-core seconds of work ``workers`` workers do per second (Amdahl's law)."""
        return 1.0 / ((1.0 - self.parallel) + self.parallel / workers)

    @property
    def remaining_core_s(self) -> float | None:
        """The work left, in core-seconds (None when nothing tells it)."""
        if self.tests == 0:
            return self.expected_core_s
        left = self.tests - self.done
        if self.expected_core_s is not None:
            return self.expected_core_s * left / self.tests
        if self.done > 0:
            return self.core_s_spent * left / self.done
        return None

    @property
    def spare_tests(self) -> int:
        """Tests no worker holds yet: what a new worker could take (none before collection)."""
        return max(0, self.tests - self.done - self.workers) if self.tests else 0


@dataclass(frozen=True)
class Waiting:
    """A waiting action (in arrival order) and the cores it needs to start."""

    action_id: str
    cores: int = 1
    malleable: bool = False
    """A malleable test run (it may start after the other waiting actions, see
    `ResizeConfig.others_first`)."""

    def __post_init__(self) -> None:
        if self.cores < 1:
            raise ValueError(f"{self.action_id}: needs at least one core")


@dataclass(frozen=True)
class ResizeConfig:
    """The measured start and collection cost of a worker, the weighting, and the least gain
    in seconds that is worth a core."""

    worker_start_s: float
    weighting: Weighting = "absolute"
    min_gain: float = 0.0
    others_first: bool = False
    """Start the waiting actions that are not malleable runs before those that are (each
    group in arrival order): an exec action never waits behind a test run."""
    move_gain: float | None = None
    """Move a core from one running run to another when the taker saves more seconds than
    the giver loses by more than this (None: cores move only to waiting actions)."""

    def __post_init__(self) -> None:
        if (self.worker_start_s < 0 or self.weighting not in WEIGHTINGS or self.min_gain < 0
                or (self.move_gain is not None and self.move_gain < 0)):
            raise ValueError("worker_start_s, min_gain and move_gain must be >= 0 and the "
                             f"weighting one of {list(WEIGHTINGS)}")


@dataclass(frozen=True)
class ResizeInputs:
    """What one decision sees: the free cores, the running malleable runs, the waiting
    actions in arrival order."""

    free_cores: int
    runs: tuple[MalleableRun, ...] = ()
    waiting: tuple[Waiting, ...] = ()
    reserve: int = 0
    """Free cores no run grows onto, kept for the actions the node expects to arrive before
    a new worker would start (waiting actions may take them)."""


@dataclass(frozen=True)
class ResizeDecision:
    """Actions to start (in order), workers to add and to retire per run, and the cores left
    idle."""

    start: tuple[str, ...] = ()
    grow: Mapping[str, int] = field(default_factory=dict)
    shrink: Mapping[str, int] = field(default_factory=dict)
    idle: int = 0


def grow_gain(run: MalleableRun, workers: int, config: ResizeConfig) -> float | None:
    """The seconds one more worker on a run of ``workers`` saves (None when its work is
    unknown)."""
    work = run.remaining_core_s
    if work is None:
        return None
    if run.max_workers is not None and workers >= run.max_workers:
        return 0.0
    now = work / run.rate(workers)
    start = 0.0 if run.starting else config.worker_start_s
    after = start + max(0.0, work - run.rate(workers) * start) / run.rate(workers + 1)
    return max(0.0, now - after)


def remaining_s(run: MalleableRun, workers: int) -> float | None:
    """The seconds ``workers`` workers take to finish the run (None when unknown)."""
    work = run.remaining_core_s
    return None if work is None else work / run.rate(workers)


def shrink_rank(run: MalleableRun, workers: int, config: ResizeConfig) -> float:
    """Which run gives a core back first (the least rank): under ``absolute`` the seconds it
    loses, under ``shortest`` minus its remaining time, under ``relative`` the share of its
    remaining time it loses, under ``equi`` minus its workers; a run of unknown work goes
    first."""
    work = run.remaining_core_s
    if work is None:
        return -math.inf
    if config.weighting == "equi":
        return -float(workers)
    now = work / run.rate(workers)
    if config.weighting == "shortest":
        return -now
    loss = work / run.rate(workers - 1) - now
    if config.weighting == "relative":
        return loss / now if now > 0 else 0.0
    return loss


def decide_resize(inputs: ResizeInputs, config: ResizeConfig) -> ResizeDecision:
    """Start the waiting actions that fit (taking cores back from malleable runs when needed),
    then give every free core to the run that gains most from it."""
    workers = {run.run_id: run.workers for run in inputs.runs}
    runs = {run.run_id: run for run in inputs.runs}
    free = inputs.free_cores
    started: list[str] = []
    shrunk: dict[str, int] = {}
    waiting = (sorted(inputs.waiting, key=lambda action: action.malleable)
               if config.others_first else inputs.waiting)
    for action in waiting:
        reclaimable = sum(n - 1 for n in workers.values())
        if free + reclaimable < action.cores:
            break
        while free < action.cores:
            victim = min((r for r in runs if workers[r] > 1), key=lambda r: (
                shrink_rank(runs[r], workers[r], config), -workers[r], r))
            workers[victim] -= 1
            shrunk[victim] = shrunk.get(victim, 0) + 1
            free += 1
        free -= action.cores
        started.append(action.action_id)
    grown: dict[str, int] = {}
    while free > inputs.reserve:
        best = _best_to_grow(runs, workers, shrunk, grown, config)
        if best is None:
            break
        workers[best] += 1
        grown[best] = grown.get(best, 0) + 1
        free -= 1
    if config.move_gain is not None:
        _move(runs, workers, shrunk, grown, config, config.move_gain)
    return ResizeDecision(start=tuple(started), grow=grown, shrink=shrunk, idle=free)


def _move(runs: Mapping[str, MalleableRun], workers: dict[str, int], shrunk: dict[str, int],
          grown: dict[str, int], config: ResizeConfig, least: float) -> None:
    """Move cores from run to run while the run the weighting grows first saves more seconds
    (start cost counted) than the run it shrinks first loses, by more than ``least``."""
    for _ in range(sum(workers.values())):
        taker = _best_to_grow(runs, workers, shrunk, grown, config, known_only=True)
        if taker is None:
            return
        givers = [r for r in runs if workers[r] > 1 and r != taker and r not in grown
                  and runs[r].remaining_core_s is not None]
        if not givers:
            return
        giver = min(givers, key=lambda r: (shrink_rank(runs[r], workers[r], config),
                                           -workers[r], r))
        work = runs[giver].remaining_core_s or 0.0
        loss = work / runs[giver].rate(workers[giver] - 1) - work / runs[giver].rate(
            workers[giver])
        if (grow_gain(runs[taker], workers[taker], config) or 0.0) - loss <= least:
            return
        workers[giver] -= 1
        shrunk[giver] = shrunk.get(giver, 0) + 1
        workers[taker] += 1
        grown[taker] = grown.get(taker, 0) + 1


def _best_to_grow(runs: Mapping[str, MalleableRun], workers: Mapping[str, int],
                  shrunk: Mapping[str, int], grown: Mapping[str, int],
                  config: ResizeConfig, known_only: bool = False) -> str | None:
    known: list[tuple[tuple[float, float], str]] = []
    unknown: list[tuple[int, str]] = []
    for run_id, run in runs.items():
        if run_id in shrunk or run.spare_tests - grown.get(run_id, 0) <= 0:
            continue
        if run.max_workers is not None and workers[run_id] >= run.max_workers:
            continue
        gain = grow_gain(run, workers[run_id], config)
        if gain is None:
            unknown.append((workers[run_id], run_id))
        elif gain > config.min_gain:
            known.append((_grow_rank(run, workers[run_id], gain, config), run_id))
    if known:
        return min(known)[1]
    return min(unknown)[1] if unknown and not known_only else None


def _grow_rank(run: MalleableRun, workers: int, gain: float,
               config: ResizeConfig) -> tuple[float, float]:
    """The least rank grows first (see the weightings in the module docstring)."""
    now = remaining_s(run, workers) or 0.0
    if config.weighting == "shortest":
        return (now, -gain)
    if config.weighting == "relative":
        return (-gain / now if now > 0 else 0.0, -gain)
    if config.weighting == "equi":
        return (float(workers), -gain)
    return (-gain, 0.0)


WORTH_STARTS = 2.0
"""A test run is made malleable when its learned single-core duration is at least this many
worker starts: a second worker started at once can then pay its own start back."""


def worth_malleable(asked: bool | None, elastic: bool, single_s: float | None,
                    worker_start_s: float) -> bool:
    """Whether a pytest run becomes a malleable run the node resizes: as the action asks
    (``asked``), else when its cores are elastic and its learned single-core duration is
    unknown (the first run of a suite, the case that needs resizing most) or at least
    :data:`WORTH_STARTS` worker starts."""
    if asked is not None:
        return asked
    return elastic and (single_s is None or single_s >= WORTH_STARTS * worker_start_s)


def node_config(worker_start_s: float, weighting: str) -> ResizeConfig:
    """The policy a node resizes its runs with, the one the simulator measures
    (``tangram:malleable``): actions that are not test runs start first, and a core moves
    between runs whenever the taker saves more than the giver loses."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"unknown weighting {weighting!r}; choose one of {list(WEIGHTINGS)}")
    chosen = next(w for w in WEIGHTINGS if w == weighting)
    return ResizeConfig(worker_start_s, chosen, others_first=True, move_gain=0.0)
