"""The discrete-event loop shared by every simulated system.

The engine owns the trajectories: it starts each RL step, waits each action's think time,
submits the action to the backend of its pool (``cpu``, ``gpu`` or ``api``), and when the
backend reports it finished, moves the trajectory on. Backends own everything about resources:
queues, units, pods, quotas, and the internal events that come with them.

Events at the same instant are batched: the loop takes the earliest time among its own events
and the backends' internal ones, lets every backend process all of its events at that time,
submits every action due then, and only then asks each backend to dispatch once. Nothing here
reads a clock; given the same workload and settings a run is reproducible to the bit.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping
from typing import Protocol

from tangram_bench.sim.record import ActionRecord, Live, RunResult
from tangram_bench.workloads.model import Workload

BEGIN, SUBMIT = 0, 1
Progress = Callable[[int], None]
"""Told how many actions have finished so far."""


class Backend(Protocol):
    """The resources of one pool type under one system."""

    def begin(self, trajectory: int, now: float) -> None:
        """A trajectory starts (a per-trajectory system creates its pod here)."""
        ...

    def submit(self, live: Live, now: float) -> None:
        """An action is submitted now."""
        ...

    def next_time(self) -> float:
        """The time of the backend's earliest internal event (inf if none)."""
        ...

    def advance(self, now: float) -> list[ActionRecord]:
        """Process every internal event at ``now``; the actions that finished."""
        ...

    def dispatch(self, now: float) -> None:
        """Start whatever can start now (called once per instant, after all its events)."""
        ...

    def end(self, trajectory: int, now: float) -> None:
        """A trajectory has finished its last action."""
        ...

    def close(self, result: RunResult) -> None:
        """Add the backend's allocations, capacities and totals to ``result``."""
        ...


class Engine:
    """Runs one workload against a set of backends, one per pool type it uses."""

    def __init__(self, workload: Workload, backends: Mapping[str, Backend],
                 progress: Progress | None = None) -> None:
        self.workload = workload
        self.backends = dict(backends)
        self.progress = progress
        self._heap: list[tuple[float, int, int, int]] = []
        self._seq = 0
        self._next = [0] * len(workload.trajectories)
        self._began = [0.0] * len(workload.trajectories)
        self._ids = {t.id: i for i, t in enumerate(workload.trajectories)}
        self._by_step: dict[int, list[int]] = {}
        for i, trajectory in enumerate(workload.trajectories):
            self._by_step.setdefault(trajectory.step, []).append(i)
        self._left: dict[int, int] = {}
        self._step_start = 0.0

    def run(self, result: RunResult) -> RunResult:
        """Simulate to the end; fills and returns ``result``."""
        self._start_step(min(self._by_step, default=0), 0.0)
        order = list(self.backends.values())
        while True:
            now = min([self._heap[0][0] if self._heap else math.inf]
                      + [backend.next_time() for backend in order])
            if now == math.inf:
                break
            finished: list[ActionRecord] = []
            for backend in order:
                finished.extend(backend.advance(now))
            while self._heap and self._heap[0][0] <= now:
                self._fire(heapq.heappop(self._heap), now)
            for record in finished:
                self._finished(record, now, result)
            for backend in order:
                backend.dispatch(now)
        for backend in order:
            backend.close(result)
        result.makespan = max((r.finished for r in result.records), default=0.0)
        return result

    def _push(self, time: float, code: int, trajectory: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (time, self._seq, code, trajectory))

    def _start_step(self, step: int, now: float) -> None:
        self._step_start = now
        members = self._by_step.get(step, [])
        self._left[step] = len(members)
        for i in members:
            self._push(now + self.workload.trajectories[i].start_s, BEGIN, i)

    def _fire(self, event: tuple[float, int, int, int], now: float) -> None:
        _, _, code, i = event
        trajectory = self.workload.trajectories[i]
        if code == BEGIN:
            self._began[i] = now
            for backend in self.backends.values():
                backend.begin(i, now)
            if trajectory.actions:
                self._push(now + trajectory.actions[0].think_s, SUBMIT, i)
            return
        index = self._next[i]
        pool = trajectory.actions[index].pool
        self.backends[pool].submit(Live(i, index, now), now)

    def _finished(self, record: ActionRecord, now: float, result: RunResult) -> None:
        result.records.append(record)
        if self.progress is not None and len(result.records) % 500 == 0:
            self.progress(len(result.records))
        i = self._ids[record.trajectory]
        trajectory = self.workload.trajectories[i]
        self._next[i] += 1
        if self._next[i] < len(trajectory.actions):
            self._push(now + trajectory.actions[self._next[i]].think_s, SUBMIT, i)
            return
        result.trajectory_times[trajectory.id] = now - self._began[i]
        for backend in self.backends.values():
            backend.end(i, now)
        self._left[trajectory.step] -= 1
        if self._left[trajectory.step] == 0:
            result.step_times.append(now - self._step_start)
            later = [s for s in self._by_step if s > trajectory.step]
            if later:
                self._start_step(min(later), now + self.workload.step_gap_s)
