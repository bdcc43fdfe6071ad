"""One pool of exclusive units scheduled by a pluggable policy: a CPU node or the GPU pool.

Waiting actions become scheduler jobs (shaped by the system); at each dispatch the pool hands
its policy a :class:`~tangram_celery.scheduling.Snapshot` (the queue in arrival order, the free
units, the running jobs with their expected finishes) and carries out the decision: every start
must name free, distinct units, or the run stops with :class:`OverAllocation`. A ``Placer``
may re-pick the concrete units of a start among equivalent ones and add a set-up time (a GPU
model restore).
"""

from __future__ import annotations

import time
from bisect import insort
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from tangram_bench.sim.durations import DurationMode, Durations
from tangram_bench.sim.policy import Policy, Shape, job_for
from tangram_bench.sim.record import ActionRecord, Allocation, Live, RunResult
from tangram_bench.sim.timeline import Timeline
from tangram_bench.workloads.model import ActionSpec, Workload
from tangram_celery.scheduling import Job, Option, Pool, RunningJob, Snapshot, Start


class OverAllocation(RuntimeError):
    """A policy granted units that are not free: a bug in the policy or the simulator."""


@dataclass(frozen=True)
class Pending:
    """A waiting action: the action, its spec, when it entered this pool's queue."""

    live: Live
    spec: ActionSpec
    arrived: float


@dataclass(frozen=True)
class Launch:
    """A started action: its units, set-up seconds (restore), exec start and finish."""

    job_id: str
    pending: Pending
    units: tuple[int, ...]
    started: float
    setup_s: float
    finish: float
    loaded: bool
    sched_s: float


class Placer(Protocol):
    """Re-picks the concrete units of the starts of one decision and says their set-up time."""

    def place(
        self, starts: Sequence[tuple[Start, ActionSpec]], free: Sequence[int]
    ) -> list[tuple[tuple[int, ...], float]]:
        """(units, set-up seconds) of each start, in order."""
        ...


View = Callable[[tuple[int, ...]], Pool]
"""Builds the scheduler's view of the pool from its free unit ids."""


class UnitPool:
    """Exclusive units, a FCFS queue of shaped jobs, and the policy that admits them."""

    def __init__(self, name: str, units: Sequence[int], view: View, policy: Policy,
                 placer: Placer | None = None) -> None:
        self.name = name
        self.total = len(units)
        self.free = sorted(units)
        self.view = view
        self.policy = policy
        self.placer = placer
        self.waiting: list[Job] = []
        self.pending: dict[str, Pending] = {}
        self.running: dict[str, RunningJob] = {}
        self.dirty = False
        self.calls = 0
        self.wall_s = 0.0

    def enqueue(self, job: Job, pending: Pending) -> None:
        """Add a job to the back of the queue."""
        self.waiting.append(job)
        self.pending[job.job_id] = pending
        self.dirty = True

    def release(self, job_id: str, units: Sequence[int]) -> None:
        """A job finished: its units are free again."""
        del self.running[job_id]
        for unit in units:
            insort(self.free, unit)
        self.dirty = True

    def schedule(self, now: float) -> list[Launch]:
        """Run the policy if anything changed and something could start; carry it out."""
        if not self.dirty or not self.waiting or not self.free:
            self.dirty = False
            return []
        self.dirty = False
        snapshot = Snapshot(now, tuple(self.waiting), (self.view(tuple(self.free)),),
                            tuple(self.running.values()))
        began = time.perf_counter()
        decision = self.policy(snapshot)
        spent = time.perf_counter() - began
        self.calls += 1
        self.wall_s += spent
        if decision.unplaceable:
            raise OverAllocation(f"pool {self.name}: jobs {decision.unplaceable[:3]} can never "
                                 "run here; give the pool more units or lower their minimum")
        if not decision.starts:
            return []
        return self._carry_out(decision.starts, now, spent)

    def _carry_out(self, starts: Sequence[Start], now: float, spent: float) -> list[Launch]:
        specs = [(start, self.pending[start.job_id].spec) for start in starts]
        free = set(self.free)
        placed = (self.placer.place(specs, self.free) if self.placer is not None
                  else [(start.units, 0.0) for start in starts])
        launches = []
        for (start, spec), (units, setup) in zip(specs, placed, strict=True):
            taken = set(units)
            if len(taken) != len(units) or not taken <= free:
                raise OverAllocation(f"pool {self.name}: {start.job_id} granted busy units")
            free -= taken
            finish = now + setup + spec.duration(len(units))
            expected = (None if start.expected_duration is None
                        else now + setup + start.expected_duration)
            pending = self.pending.pop(start.job_id)
            self.running[start.job_id] = RunningJob(start.job_id, self.name, len(units),
                                                    expected, tuple(units), spec.service)
            launches.append(Launch(start.job_id, pending, tuple(units), now, setup, finish,
                                   setup > 0, spent))
        self.free = sorted(free)
        started = {start.job_id for start in starts}
        self.waiting = [job for job in self.waiting if job.job_id not in started]
        return launches


def launch_record(launch: Launch, trajectory: str, node: str, finished: float,
                  used: float) -> ActionRecord:
    """The record of a pooled action that finished at ``finished``."""
    pending = launch.pending
    return ActionRecord(
        trajectory=trajectory,
        index=pending.live.index,
        kind=pending.spec.kind,
        pool=pending.spec.pool,
        node=node,
        units=len(launch.units),
        submitted=pending.live.submitted,
        started=launch.started,
        finished=finished,
        queue=launch.started - pending.arrived,
        exec=finished - launch.started - launch.setup_s,
        overhead=pending.arrived - pending.live.submitted + launch.setup_s,
        held=len(launch.units) * (finished - launch.started),
        used=used,
        loaded=launch.loaded,
        sched_s=launch.sched_s,
    )


class PooledBackend:
    """A pooled system's backend over one or more :class:`UnitPool` of one resource type.

    Every action pays ``dispatch_s`` before it joins the queue of the pool :meth:`route`
    picks; finished actions give their units back. Subclasses choose the route and what an
    action used.
    """

    resource = "units"

    def __init__(self, workload: Workload, shape: Shape, dispatch_s: float,
                 pools: Sequence[UnitPool], durations: Durations | None = None) -> None:
        self.workload = workload
        self.shape = shape
        self.durations = durations or Durations(DurationMode("oracle"))
        self.dispatch_s = dispatch_s
        self.pools = list(pools)
        self.timeline: Timeline[tuple[int, Live | Launch]] = Timeline()
        self.allocations: list[Allocation] = []

    def route(self, live: Live) -> int:
        """The index of the pool the action queues at."""
        del live
        return 0

    def used(self, launch: Launch, finished: float) -> float:
        """Unit-seconds of work the action did."""
        return launch.pending.spec.t1

    def begin(self, trajectory: int, now: float) -> None:
        """Nothing to do when a trajectory starts."""

    def end(self, trajectory: int, now: float) -> None:
        """Nothing to do when a trajectory ends."""

    def submit(self, live: Live, now: float) -> None:
        """The action joins its pool's queue after the dispatch cost."""
        self.timeline.push(now + self.dispatch_s, (self.route(live), live))

    def next_time(self) -> float:
        """The next arrival or finish."""
        return self.timeline.next_time()

    def advance(self, now: float) -> list[ActionRecord]:
        """Queue the arrivals, release the finished."""
        done = []
        for index, item in self.timeline.due(now):
            pool = self.pools[index]
            if isinstance(item, Live):
                self.arrive(index, item, now)
                continue
            pool.release(item.job_id, item.units)
            self.allocations.append(Allocation(pool.name, item.units, item.started, now))
            trajectory = self.workload.trajectories[item.pending.live.trajectory].id
            record = launch_record(item, trajectory, pool.name, now, self.used(item, now))
            self.learn(index, item, record)
            done.append(record)
        return done

    def arrive(self, index: int, live: Live, now: float) -> Job:
        """The action joins the queue of pool ``index`` as a job shaped by the system."""
        pool = self.pools[index]
        spec = self.workload.trajectories[live.trajectory].actions[live.index]
        job_id = f"{live.trajectory}.{live.index}"

        def seen(options: tuple[Option, ...]) -> tuple[Option, ...]:
            return self.durations.options(index, job_id, spec, options)

        job = job_for(job_id, pool.name, spec, now, self.shape, seen)
        pool.enqueue(job, Pending(live, spec, now))
        return job

    def learn(self, index: int, launch: Launch, record: ActionRecord) -> None:
        """Pool ``index`` learns from a finished action (learned durations only)."""
        self.durations.observe(index, launch.pending.spec, record.units, record.exec)

    def dispatch(self, now: float) -> None:
        """Let every pool that changed schedule itself."""
        for index, pool in enumerate(self.pools):
            for launch in pool.schedule(now):
                self.timeline.push(launch.finish, (index, launch))

    def close(self, result: RunResult) -> None:
        """Allocations, capacity, reserved unit-seconds and scheduling calls."""
        result.allocations.extend(self.allocations)
        result.capacity[self.resource] = float(sum(pool.total for pool in self.pools))
        result.reserved += sum(r.held for r in result.records if r.pool == self.resource)
        result.decide_calls += sum(pool.calls for pool in self.pools)
        result.decide_s += sum(pool.wall_s for pool in self.pools)
