"""Resize decisions for malleable test runs: which running runs grow or shrink, which waiting
actions start. Pure: plain data in, a `ResizeDecision` out; not wired into a node yet.

A malleable run's workers pull test ids from one queue, so cores can join it and leave it while
it runs (`tangram_celery.sandbox.malleable`). At each event (an action arrives or ends, a run
reports progress) `decide_resize` takes the free cores, the running malleable runs and the
waiting actions, and decides:

* **Waiting actions first, in arrival order.** Each starts on free cores; when too few are
  free it takes cores back from malleable runs at once (a run keeps at least one worker),
  each time from the run that loses least by it. An action that cannot start even so waits,
  and so does every action behind it (no backfilling, as the pool's own queue).
* **Then every free core goes to a run that gains from it**, one core at a time to the run
  with the largest gain, until no run gains. A run given cores back in this decision does not
  grow in it.

Remaining work, in core-seconds: the run's learned single-core duration times the share of its
tests not yet done (`expected_core_s`); without a learned duration, the core-seconds spent so
far times the tests left over the tests done; unknown before the first test ends. With
remaining work ``W`` on ``k`` workers (linear speed-up among workers), a new worker starts after
``s`` seconds (`ResizeConfig.worker_start_s`: the measured start and collection cost) while
the ``k`` go on, so the run ends at ``s + (W - k s) / (k + 1)`` instead of ``W / k``; the gain is
the difference (nothing when it is not positive, or when no test is left for the new worker).
Taking one of ``k`` workers costs ``W / (k - 1) - W / k``. The `weighting` chooses among the
runs that gain: ``absolute`` grows the run that saves most seconds and shrinks the one that
loses fewest (in effect long runs first); ``shortest`` grows the run with the least remaining
time ``W / k`` and shrinks the one with the most (short runs first, in the spirit of heSRPT and
SRPT: a run that ends early hands all its cores on). A run whose remaining work is unknown grows
only onto cores no run with a known gain wants, and gives cores back first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Weighting = Literal["absolute", "shortest"]
WEIGHTINGS: tuple[Weighting, ...] = ("absolute", "shortest")


@dataclass(frozen=True)
class MalleableRun:
    """A running malleable test run: its workers that take tests (retiring ones not counted),
    its tests (0 while its first worker collects), the tests done, the core-seconds its workers
    spent so far, and its signature's learned single-core duration (None when not learned)."""

    run_id: str
    workers: int
    tests: int
    done: int
    core_s_spent: float = 0.0
    expected_core_s: float | None = None

    def __post_init__(self) -> None:
        if self.workers < 1 or self.done < 0 or self.tests < 0 or self.done > self.tests:
            raise ValueError(f"{self.run_id}: needs workers >= 1 and 0 <= done <= tests")

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

    def __post_init__(self) -> None:
        if self.worker_start_s < 0 or self.weighting not in WEIGHTINGS or self.min_gain < 0:
            raise ValueError(f"worker_start_s and min_gain must be >= 0 and the weighting one "
                             f"of {list(WEIGHTINGS)}")


@dataclass(frozen=True)
class ResizeInputs:
    """What one decision sees: the free cores, the running malleable runs, the waiting
    actions in arrival order."""

    free_cores: int
    runs: tuple[MalleableRun, ...] = ()
    waiting: tuple[Waiting, ...] = ()


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
    now = work / workers
    after = config.worker_start_s + max(0.0, work - workers * config.worker_start_s) / (
        workers + 1)
    return max(0.0, now - after)


def shrink_rank(run: MalleableRun, workers: int, config: ResizeConfig) -> float:
    """Which run gives a core back first (the least rank): under ``absolute`` the seconds it
    loses, under ``shortest`` minus its remaining time; a run of unknown work goes first."""
    work = run.remaining_core_s
    if work is None:
        return -math.inf
    if config.weighting == "shortest":
        return -work / workers
    return work / (workers - 1) - work / workers


def decide_resize(inputs: ResizeInputs, config: ResizeConfig) -> ResizeDecision:
    """Start the waiting actions that fit (taking cores back from malleable runs when needed),
    then give every free core to the run that gains most from it."""
    workers = {run.run_id: run.workers for run in inputs.runs}
    runs = {run.run_id: run for run in inputs.runs}
    free = inputs.free_cores
    started: list[str] = []
    shrunk: dict[str, int] = {}
    for action in inputs.waiting:
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
    while free > 0:
        best = _best_to_grow(runs, workers, shrunk, grown, config)
        if best is None:
            break
        workers[best] += 1
        grown[best] = grown.get(best, 0) + 1
        free -= 1
    return ResizeDecision(start=tuple(started), grow=grown, shrink=shrunk, idle=free)


def _best_to_grow(runs: Mapping[str, MalleableRun], workers: Mapping[str, int],
                  shrunk: Mapping[str, int], grown: Mapping[str, int],
                  config: ResizeConfig) -> str | None:
    known: list[tuple[float, str]] = []
    unknown: list[tuple[int, str]] = []
    for run_id, run in runs.items():
        if run_id in shrunk or run.spare_tests - grown.get(run_id, 0) <= 0:
            continue
        gain = grow_gain(run, workers[run_id], config)
        if gain is None:
            unknown.append((workers[run_id], run_id))
        elif gain > config.min_gain:
            work = run.remaining_core_s or 0.0
            rank = work / workers[run_id] if config.weighting == "shortest" else -gain
            known.append((rank, run_id))
    if known:
        return min(known)[1]
    return min(unknown)[1] if unknown else None
