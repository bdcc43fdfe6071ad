"""CPU nodes whose test runs are malleable: cores join and leave a running test run.

The system ``tangram:malleable[:<weighting>]``. Trajectories are pinned to a node as on
:class:`~tangram_bench.sim.nodes.CpuNodes`. At every event of a node (an action arrives, an
action ends, a taken-back core comes free) the node calls the pure
:func:`~tangram_celery.scheduling.malleable.decide_resize` and carries its decision out:

* waiting actions start in arrival order, a test run on one core; an exec action that finds no
  free core takes one back from a running test run at once;
* every free core goes to the running test run that gains most from it (by the weighting).

A test run progresses at the rate of the cores that work on it: on ``c`` cores it does
``1 / duration(c)`` of its work per second (the workload's Amdahl law). A core that joins a run
works on it ``worker_start_s`` after it joins (a worker's start and collection); cores given
to a run at the instant it starts work at once (its workers start together). A core taken back
stops working on its run at once and is free ``takeback_s`` later; the action it is taken for
starts then. The policy sees what a node sees: the learned single-core duration and parallel
fraction of the run's signature (at its arrival), the share of its tests done
(``tests`` nominal tests per run) and its core-seconds; no exact duration. A finished run
teaches the duration model its wall time at its time-weighted mean core count.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from dataclasses import dataclass, field

from tangram_bench.sim.cluster import Cluster
from tangram_bench.sim.costs import Costs
from tangram_bench.sim.durations import DurationMode, Durations
from tangram_bench.sim.pooled import Pending
from tangram_bench.sim.record import ActionRecord, Allocation, Live, RunResult
from tangram_bench.sim.timeline import Timeline
from tangram_bench.workloads.model import Workload
from tangram_celery.scheduling.malleable import (
    MalleableRun,
    ResizeConfig,
    ResizeDecision,
    ResizeInputs,
    Waiting,
    Weighting,
    decide_resize,
)


@dataclass(frozen=True)
class MalleableKnobs:
    """The costs of resizing a test run, and the policy's weighting (see :data:`SOURCES`)."""

    worker_start_s: float = 0.75
    takeback_s: float = 0.0003
    tests: int = 1000
    weighting: Weighting = "absolute"
    reserve_s: float = 0.0
    window_s: float = 10.0
    move_gain: float | None = 0.0
    others_first: bool = True

    def __post_init__(self) -> None:
        if min(self.worker_start_s, self.takeback_s, self.reserve_s) < 0 or self.tests < 1 \
                or self.window_s <= 0:
            raise ValueError("worker_start_s, takeback_s and reserve_s must be >= 0, tests >= 1 "
                             "and window_s > 0")


MIN_TESTS = 10
"""The fewest tests a stretch at one core count must finish for a node to learn from it."""

SOURCES: dict[str, str] = {
    "worker_start_s": (
        "seconds a core that joins a running test run holds before it works on it (a new "
        "worker's start and collection): `tangram bench malleable --repeat 3` measured 0.5-1.0 s "
        "on real suites; 0.75 s, the middle (`--grow-cost`)"),
    "takeback_s": (
        "seconds before a core taken back from a test run is free for the action it is taken "
        "for (the node narrows the run's cpuset first, then asks it to retire a worker): "
        "`tangram bench takeback --cycles 20` measured medians of 0.25-0.30 ms on bubblewrap "
        "and Docker; 0.3 ms (`--takeback`)"),
    "reserve_s": (
        "cores kept free for the actions that are not test runs: as many as arrived per second "
        "over the last `window_s` times this; 0: none (`--reserve`)"),
    "tests": "tests per test run, to count the share done (an assumption)",
}
"""Where each knob's default comes from."""

FLAGS = {"worker_start_s": "--grow-cost", "takeback_s": "--takeback", "reserve_s": "--reserve"}
"""The command-line flag of each knob that has one."""


def knob_rows(knobs: MalleableKnobs) -> list[tuple[str, str, str]]:
    """(flag, value, source) rows for a report's costs table."""
    return [(FLAGS.get(name, name), f"{getattr(knobs, name):g}", source)
            for name, source in SOURCES.items()]


@dataclass
class Run:
    """A running action: its cores (in the order they joined), when each joined and when it
    works from, the share of its work left as of ``since``, and what it held so far."""

    job_id: str
    pending: Pending
    started: float
    malleable: bool
    units: list[int]
    joined: dict[int, float]
    ready: dict[int, float]
    expected: float | None = None
    parallel: float = 1.0
    left: float = 1.0
    since: float = 0.0
    working: int = 0
    version: int = 0
    worker_s: float = 0.0
    held: float = 0.0
    finish: float = math.inf
    marks: list[tuple[float, float, int]] = field(default_factory=list)
    """(time, share done, cores working from then) at each change of its working cores."""


@dataclass
class Node:
    """One node: its free cores, its queue (arrival order) and its running actions."""

    name: str
    total: int
    free: list[int]
    waiting: list[tuple[str, Pending]] = field(default_factory=list)
    running: dict[str, Run] = field(default_factory=dict)
    dirty: bool = False
    arrivals: deque[float] = field(default_factory=deque)
    """When the actions that are not test runs arrived, over the last ``window_s``."""


class MalleableNodes:
    """The CPU backend of ``tangram:malleable``."""

    def __init__(self, workload: Workload, cluster: Cluster, costs: Costs,
                 knobs: MalleableKnobs | None = None, durations: Durations | None = None
                 ) -> None:
        self.workload = workload
        self.knobs = knobs or MalleableKnobs()
        self.config = ResizeConfig(self.knobs.worker_start_s, self.knobs.weighting,
                                   others_first=self.knobs.others_first,
                                   move_gain=self.knobs.move_gain)
        self.durations = durations or Durations(DurationMode("oracle"))
        self.dispatch_s = costs.dispatch_s
        size = cluster.cores_per_node
        self.nodes = [Node(f"cpu-{n}", size, list(range(size))) for n in range(cluster.cpu_nodes)]
        self.timeline: Timeline[tuple[int, object]] = Timeline()
        self.allocations: list[Allocation] = []
        self.pins: dict[int, int] = {}
        self.pinned = [0] * len(self.nodes)
        self.calls = 0
        self.wall_s = 0.0
        self.resizes = 0

    def begin(self, trajectory: int, now: float) -> None:
        """Nothing to do when a trajectory starts."""

    def end(self, trajectory: int, now: float) -> None:
        """Unpin the trajectory's environment."""
        node = self.pins.pop(trajectory, None)
        if node is not None:
            self.pinned[node] -= 1

    def submit(self, live: Live, now: float) -> None:
        """The action joins its node's queue after the dispatch cost."""
        self.timeline.push(now + self.dispatch_s, (self._route(live), live))

    def next_time(self) -> float:
        """The next arrival, finish, worker start or freed core."""
        return self.timeline.next_time()

    def advance(self, now: float) -> list[ActionRecord]:
        """Queue the arrivals, end the finished runs, count the workers that started."""
        done = []
        for index, item in self.timeline.due(now):
            node = self.nodes[index]
            if isinstance(item, Live):
                spec = self.workload.trajectories[item.trajectory].actions[item.index]
                pending = Pending(item, spec, now)
                node.waiting.append((f"{item.trajectory}.{item.index}", pending))
                if not _malleable(pending):
                    node.arrivals.append(now)
                node.dirty = True
                continue
            assert isinstance(item, tuple)
            if item[0] == "free":
                node.free = sorted(node.free + item[1])
                node.dirty = True
                continue
            run = node.running.get(item[1])
            if run is not None and item[0] == "ready":
                self._retime(index, run, now)
            elif run is not None and run.version == item[2]:
                done.append(self._finished(index, run, now))
        return done

    def dispatch(self, now: float) -> None:
        """Every node that changed decides (once more if it started a test run and has free
        cores left, so the run can widen at once)."""
        for index, node in enumerate(self.nodes):
            if not node.dirty:
                continue
            node.dirty = False
            decision = self._decide(index, now)
            if decision.start and node.free and any(
                    node.running[j].malleable for j in decision.start if j in node.running):
                self._decide(index, now)

    def close(self, result: RunResult) -> None:
        """Allocations, capacity, reserved core-seconds and decision calls."""
        result.allocations.extend(self.allocations)
        result.capacity["cpu"] = float(sum(node.total for node in self.nodes))
        result.reserved += sum(r.held for r in result.records if r.pool == "cpu")
        result.decide_calls += self.calls
        result.decide_s += self.wall_s

    def _route(self, live: Live) -> int:
        node = self.pins.get(live.trajectory)
        if node is None:
            node = min(range(len(self.nodes)), key=lambda n: (
                not self.nodes[n].free, self.pinned[n], -len(self.nodes[n].free), n))
            self.pins[live.trajectory] = node
            self.pinned[node] += 1
        return node

    def _inputs(self, node: Node, now: float) -> ResizeInputs:
        tests = self.knobs.tests
        runs = tuple(
            MalleableRun(run.job_id, len(run.units), tests,
                         min(tests, int((1.0 - self._left(run, now)) * tests)),
                         run.worker_s, run.expected, run.parallel,
                         max(run.pending.spec.units), run.started >= now)
            for run in node.running.values() if run.malleable)
        waiting = tuple(Waiting(job_id, pending.spec.units[0], _malleable(pending))
                        for job_id, pending in node.waiting)
        window = self.knobs.window_s
        while node.arrivals and node.arrivals[0] < now - window:
            node.arrivals.popleft()
        reserve = math.floor(len(node.arrivals) / window * self.knobs.reserve_s)
        return ResizeInputs(len(node.free), runs, waiting, reserve)

    def _decide(self, index: int, now: float) -> ResizeDecision:
        node = self.nodes[index]
        inputs = self._inputs(node, now)
        began = time.perf_counter()
        decision = decide_resize(inputs, self.config)
        self.wall_s += time.perf_counter() - began
        self.calls += 1
        taken: list[int] = []
        for job_id, count in decision.shrink.items():
            taken.extend(self._shrink(index, node.running[job_id], count, now))
        started = set(decision.start)
        for job_id, pending in [w for w in node.waiting if w[0] in started]:
            self._start(index, job_id, pending, taken, now)
        node.waiting = [w for w in node.waiting if w[0] not in started]
        for job_id, count in decision.grow.items():
            self._grow(index, node.running[job_id], count, taken, now)
        if taken:
            self.timeline.push(now + self.knobs.takeback_s, (index, ("free", taken)))
        return decision

    def _start(self, index: int, job_id: str, pending: Pending, taken: list[int],
               now: float) -> None:
        node = self.nodes[index]
        spec = pending.spec
        need = spec.units[0]
        units = node.free[:need]
        del node.free[:need]
        late = need - len(units)
        if late:
            units += taken[:late]
            del taken[:late]
        start = now + (self.knobs.takeback_s if late else 0.0)
        malleable = _malleable(pending)
        run = Run(job_id, pending, start, malleable, list(units),
                  dict.fromkeys(units, start), dict.fromkeys(units, start), since=start)
        if malleable:
            run.expected, run.parallel = self._learned(index, job_id, pending)
        node.running[job_id] = run
        self._retime(index, run, now)

    def _learned(self, index: int, job_id: str, pending: Pending) -> tuple[float | None, float]:
        """The learned single-core seconds and parallel fraction of a test run."""
        spec = pending.spec
        most = max(spec.units)
        exact = ((1, spec.duration(1)), (most, spec.duration(most)))
        options = dict(self.durations.options(index, job_id, spec, exact))
        one, wide = options.get(1), options.get(most)
        if one is None or wide is None or most == 1 or one <= 0:
            return one, 1.0
        return one, min(1.0, max(0.0, (1.0 - wide / one) / (1.0 - 1.0 / most)))

    def _shrink(self, index: int, run: Run, count: int, now: float) -> list[int]:
        """Take ``count`` cores back from ``run`` (its newest first); they are free to the
        actions started in this decision ``takeback_s`` from now."""
        self._progress(run, now)
        gone = run.units[-count:]
        del run.units[-count:]
        until = now + self.knobs.takeback_s
        for unit in gone:
            self._give_back(index, run, unit, until)
        self.resizes += 1
        self._retime(index, run, now)
        return gone

    def _grow(self, index: int, run: Run, count: int, taken: list[int], now: float) -> None:
        """Add ``count`` cores to ``run``: free ones, then ones taken back in this decision
        (they join when they come free)."""
        node = self.nodes[index]
        self._progress(run, now)
        units = node.free[:count]
        del node.free[:count]
        moved = taken[:count - len(units)]
        del taken[:len(moved)]
        start = now if run.started >= now else now + self.knobs.worker_start_s
        for unit in units + moved:
            joined = now + self.knobs.takeback_s if unit in moved else now
            run.units.append(unit)
            run.joined[unit] = max(joined, run.started)
            run.ready[unit] = max(start, joined, run.started)
            if run.ready[unit] > now:
                self.timeline.push(run.ready[unit], (index, ("ready", run.job_id)))
        self.resizes += 1
        self._retime(index, run, now)

    def _give_back(self, index: int, run: Run, unit: int, until: float) -> None:
        start = run.joined.pop(unit)
        run.ready.pop(unit)
        self.allocations.append(Allocation(self.nodes[index].name, (unit,), start, until))
        run.held += until - start

    def _left(self, run: Run, now: float) -> float:
        if now <= run.since or run.working == 0:
            return run.left
        return max(0.0, run.left - (now - run.since) / run.pending.spec.duration(run.working))

    def _progress(self, run: Run, now: float) -> None:
        if now > run.since:
            run.left = self._left(run, now)
            run.worker_s += len(run.units) * (now - run.since)
            run.since = now

    def _retime(self, index: int, run: Run, now: float) -> None:
        """Count the work done so far and push the finish the cores working now give."""
        self._progress(run, now)
        at = max(now, run.since)
        working = max(1, sum(1 for unit in run.units if run.ready[unit] <= at))
        if run.malleable and working != run.working:
            run.marks.append((at, 1.0 - run.left, working))
        run.working = working
        run.finish = at + run.left * run.pending.spec.duration(run.working)
        run.version += 1
        self.timeline.push(run.finish, (index, ("finish", run.job_id, run.version)))

    def _learn(self, index: int, run: Run, now: float) -> None:
        """Teach the duration model what the run's progress showed: for each stretch at one
        core count over at least :data:`MIN_TESTS` tests, the seconds a whole run takes at
        that count (its tests done counted whole, as a node counts them)."""
        tests = self.knobs.tests
        marks = [*run.marks, (now, 1.0, 0)]
        for (began, share, cores), (ended, later, _) in itertools.pairwise(marks):
            done = math.floor(later * tests + 1e-9) - math.floor(share * tests + 1e-9)
            if done >= min(MIN_TESTS, tests) and ended > began:
                self.durations.observe(index, run.pending.spec, cores,
                                       (ended - began) * tests / done)

    def _finished(self, index: int, run: Run, now: float) -> ActionRecord:
        node = self.nodes[index]
        self._progress(run, now)
        for unit in list(run.units):
            self._give_back(index, run, unit, now)
        node.free.extend(run.units)
        node.free.sort()
        del node.running[run.job_id]
        node.dirty = True
        pending = run.pending
        exec_s = now - run.started
        units = max(1, round(run.worker_s / exec_s)) if exec_s > 0 else len(run.units)
        if run.malleable:
            self._learn(index, run, now)
        else:
            self.durations.observe(index, pending.spec, units, exec_s)
        return ActionRecord(
            trajectory=self.workload.trajectories[pending.live.trajectory].id,
            index=pending.live.index, kind=pending.spec.kind, pool=pending.spec.pool,
            node=node.name, units=units, submitted=pending.live.submitted,
            started=run.started, finished=now, queue=run.started - pending.arrived,
            exec=exec_s, overhead=pending.arrived - pending.live.submitted,
            held=run.held, used=pending.spec.t1)


def _malleable(pending: Pending) -> bool:
    """Whether the action runs as a malleable test run (an elastic test run)."""
    return pending.spec.kind == "test_run" and pending.spec.elastic
