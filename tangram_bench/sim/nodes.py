"""Pooled CPU nodes (tangram, fixed DoP, plain Celery): per-node queues, per-node policy.

Each trajectory is pinned to one node at its first action: the node with a free core that
holds the fewest trajectories (balancing their memory), ties to the most free cores, then the
lowest index; it stays there (its environment lives there). Every action pays ``dispatch_s``
before it joins its node's queue; each node schedules itself with its own policy instance
(:class:`~tangram_bench.sim.pooled.UnitPool`), cores split evenly over NUMA groups.

**Core loans** (policies with a ``lend`` method: tangram's robust scheduler, see
:mod:`tangram_celery.scheduling.lending`), as a worker makes them
(:mod:`tangram_celery.pools.cpu_pool.loans`).
At the scheduling point where a short job arrives, if the decision leaves it waiting, it may
start at once on cores lent by a running job, alone on them, at full speed, while its job
stays in the queue as before: the decisions are the policy's own, and when the policy starts
it, it moves onto the cores it was given and the loan ends. A loan so lasts about as long as
the job would have queued. The lender keeps its other cores and runs at
:func:`~tangram_celery.scheduling.lending.lender_speed` of its speed while the loan lasts (its
finish moves later; the policy keeps seeing the expected finish it was started with, as the
worker's admission gate does; the loan plan sees the moved one). A borrower that ends before
the policy starts it stays queued and is released the moment it is started (a worker cannot
withdraw a request from its gate). A lender that finishes while it lends holds all its cores
until its loans end (a worker releases an allocation as a whole); that idle hold counts in
the reserved core-seconds. Allocations record who held each core when, so the exclusivity
invariant covers loans too; a borrower's ``held`` counts only its own cores.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace

from tangram_bench.sim.cluster import Cluster
from tangram_bench.sim.costs import Costs
from tangram_bench.sim.durations import Durations
from tangram_bench.sim.policy import PolicyFactory, Shape
from tangram_bench.sim.pooled import (
    Launch,
    PooledBackend,
    UnitPool,
    View,
    launch_record,
)
from tangram_bench.sim.record import ActionRecord, Allocation, Live, RunResult
from tangram_bench.workloads.model import Workload
from tangram_celery.scheduling import Core, CpuPool, Job, Pool
from tangram_celery.scheduling.lending import Holder, Loan, lender_speed

Lend = Callable[[Sequence[Job], Sequence[Holder], float, Collection[str]], Sequence[Loan]]
"""A policy's loan planner: the jobs left waiting, the running jobs, the clock and the jobs
that may borrow -> loans."""


def cpu_view(name: str, cores: tuple[Core, ...]) -> View:
    """The scheduler's view of one node, from its free core ids."""

    def view(free: tuple[int, ...]) -> Pool:
        return CpuPool(name, tuple(cores[i] for i in free), len(cores))

    return view


@dataclass(frozen=True)
class Borrow(Launch):
    """A borrower's run on lent cores (the event of its finish)."""


@dataclass
class Loaned:
    """A borrower: its run (the event of its end), the job it borrows from (None once the
    policy has started it on cores of its own), the cores it runs on and since when, and
    whether its run has ended (its job may still wait in the queue)."""

    launch: Borrow
    lender: str | None
    units: tuple[int, ...]
    since: float
    ended: bool = False


@dataclass
class Lending:
    """A job that has lent cores: its current launch (``finish`` moves with its speed), its
    work left in seconds at full speed as of ``since``, its loans (borrower -> cores), since
    when it holds each core it has not lent, and whether it has finished (then it holds its
    cores until its loans end)."""

    launch: Launch
    left_s: float
    since: float
    lent: dict[str, tuple[int, ...]] = field(default_factory=dict)
    held_since: dict[int, float] = field(default_factory=dict)
    done: bool = False

    @classmethod
    def of(cls, launch: Launch, now: float) -> Lending:
        """A running job about to lend for the first time."""
        return cls(launch, launch.finish - now, now,
                   held_since={unit: launch.started for unit in launch.units})

    @property
    def speed(self) -> float:
        """Its speed now (see :func:`lender_speed`)."""
        return lender_speed(len(self.launch.units), sum(map(len, self.lent.values())))

    def progress(self, now: float) -> None:
        """Count the work done since ``since`` at the current speed."""
        if not self.done:
            self.left_s = max(self.left_s - self.speed * (now - self.since), 0.0)
        self.since = now

    def retimed(self, now: float) -> Launch:
        """The launch with the finish its speed now gives (call after ``progress``)."""
        self.launch = replace(self.launch, finish=now + self.left_s / self.speed)
        return self.launch


class CpuNodes(PooledBackend):
    """The CPU backend of the pooled systems (with core loans where the policy lends)."""

    resource = "cpu"

    def __init__(self, workload: Workload, cluster: Cluster, shape: Shape,
                 policy: PolicyFactory, costs: Costs, durations: Durations | None = None
                 ) -> None:
        size = cluster.cores_per_node
        group = size // cluster.numa_per_node
        cores = tuple(Core(i, i // group) for i in range(size))
        pools = [UnitPool(f"cpu-{n}", range(size), cpu_view(f"cpu-{n}", cores), policy())
                 for n in range(cluster.cpu_nodes)]
        super().__init__(workload, shape, costs.dispatch_s, pools, durations)
        self.pins: dict[int, int] = {}
        self.pinned = [0] * len(self.pools)
        self.lend: list[Lend | None] = [getattr(p.policy, "lend", None) for p in self.pools]
        self.fresh: list[list[str]] = [[] for _ in self.pools]
        self.launches: list[dict[str, Launch]] = [{} for _ in self.pools]
        self.lending: list[dict[str, Lending]] = [{} for _ in self.pools]
        self.borrowed: list[dict[str, Loaned]] = [{} for _ in self.pools]
        self.loans = 0
        self.loan_s = 0.0
        self.held_after = 0.0

    def route(self, live: Live) -> int:
        """The trajectory's node, pinned at its first action."""
        node = self.pins.get(live.trajectory)
        if node is None:
            node = min(range(len(self.pools)), key=lambda n: (
                not self.pools[n].free, self.pinned[n], -len(self.pools[n].free), n))
            self.pins[live.trajectory] = node
            self.pinned[node] += 1
        return node

    def end(self, trajectory: int, now: float) -> None:
        """Unpin the trajectory's environment."""
        node = self.pins.pop(trajectory, None)
        if node is not None:
            self.pinned[node] -= 1

    def advance(self, now: float) -> list[ActionRecord]:
        """Queue the arrivals, end the finished runs and loans."""
        done = []
        for index, item in self.timeline.due(now):
            if isinstance(item, Live):
                self.fresh[index].append(self.arrive(index, item, now).job_id)
            elif isinstance(item, Borrow):
                done.append(self._ended(index, item, now))
            else:
                lending = self.lending[index].get(item.job_id)
                current = item if lending is None else lending.launch
                if current is not item or item.job_id not in self.launches[index]:
                    continue  # a finish its loans have moved, or of a job already gone
                done.append(self._finished(index, item, lending, now))
        return done

    def dispatch(self, now: float) -> None:
        """Let every pool that changed schedule itself (borrowers it starts move onto their
        cores; ended ones give them back at once); then lend to the jobs that arrived now
        and still wait."""
        for index, pool in enumerate(self.pools):
            again = True
            while again:
                again = False
                for launch in pool.schedule(now):
                    loaned = self.borrowed[index].get(launch.job_id)
                    if loaned is None:
                        self.launches[index][launch.job_id] = launch
                        self.timeline.push(launch.finish, (index, launch))
                    elif loaned.ended:
                        pool.release(launch.job_id, launch.units)
                        del self.borrowed[index][launch.job_id]
                        again = True
                    else:
                        self._own(index, loaned, launch.units, now)
            fresh, self.fresh[index] = self.fresh[index], []
            lend = self.lend[index]
            if lend is not None and fresh and pool.waiting:
                waiting = set(fresh) & {job.job_id for job in pool.waiting}
                if waiting:
                    self._lend(index, lend, waiting, now)

    def close(self, result: RunResult) -> None:
        """As for every pooled backend, plus the cores lenders held idle for their loans."""
        super().close(result)
        result.reserved += self.held_after

    def _holders(self, index: int) -> list[Holder]:
        """The running jobs of pool ``index`` as the loan plan sees them (borrowers never
        lend)."""
        lending, borrowed = self.lending[index], self.borrowed[index]
        return [Holder(job_id, self.launches[index][job_id].units,
                       _finish(lending.get(job_id), running.expected_finish),
                       _lent(lending.get(job_id)),
                       not _done(lending.get(job_id)) and job_id not in borrowed)
                for job_id, running in self.pools[index].running.items()]

    def _lend(self, index: int, lend: Lend, fresh: set[str], now: float) -> None:
        pool = self.pools[index]
        borrowed = self.borrowed[index]
        waiting = [job for job in pool.waiting if job.job_id not in borrowed]
        began = time.perf_counter()
        loans = lend(waiting, self._holders(index), now, fresh)
        pool.wall_s += time.perf_counter() - began
        for loan in loans:
            pending = pool.pending[loan.borrower]
            finish = now + pending.spec.duration(len(loan.units))
            launch = Borrow(loan.borrower, pending, loan.units, now, 0.0, finish, False, 0.0)
            borrowed[loan.borrower] = Loaned(launch, loan.lender, loan.units, now)
            self._lend_units(index, loan.lender, loan.borrower, loan.units, now)
            self.timeline.push(finish, (index, launch))
            self.loans += 1

    def _lend_units(self, index: int, lender_id: str, borrower: str, units: tuple[int, ...],
                    now: float) -> None:
        """``lender_id`` lends ``units`` to ``borrower`` from now on (and slows down)."""
        lender = self.lending[index].get(lender_id)
        if lender is None:
            launch = self.launches[index][lender_id]
            lender = self.lending[index][lender_id] = Lending.of(launch, now)
        lender.progress(now)
        name = self.pools[index].name
        for unit in units:
            self.allocations.append(Allocation(name, (unit,), lender.held_since.pop(unit), now))
        lender.lent[borrower] = units
        self._retime(index, lender, now)

    def _unlend(self, index: int, loaned: Loaned, now: float) -> None:
        """The loan of ``loaned`` ends now: its lender has the cores back (and speeds up, or,
        if it has finished and lends nothing more, releases them)."""
        assert loaned.lender is not None
        lender = self.lending[index][loaned.lender]
        lender.progress(now)
        del lender.lent[loaned.launch.job_id]
        self.allocations.append(Allocation(self.pools[index].name, loaned.units, loaned.since,
                                           now))
        self.loan_s += len(loaned.units) * (now - loaned.since)
        for unit in loaned.units:
            lender.held_since[unit] = now
        loaned.lender = None
        if lender.done and not lender.lent:
            self.held_after += len(lender.launch.units) * (now - lender.launch.finish)
            self._release(index, lender, now)
        else:
            self._retime(index, lender, now)

    def _own(self, index: int, loaned: Loaned, units: tuple[int, ...], now: float) -> None:
        """The policy started a running borrower: it moves onto its own cores."""
        self._unlend(index, loaned, now)
        loaned.units, loaned.since = units, now
        self.launches[index][loaned.launch.job_id] = replace(loaned.launch, units=units)

    def _retime(self, index: int, lender: Lending, now: float) -> None:
        """Move a running lender's finish to what its speed now gives. The policy keeps the
        expected finish it was started with, as a worker's admission gate does."""
        if not lender.done:
            launch = lender.retimed(now)
            self.timeline.push(launch.finish, (index, launch))

    def _ended(self, index: int, borrow: Borrow, now: float) -> ActionRecord:
        """A borrower's run ends: it gives back the cores it runs on, lent or its own."""
        pool = self.pools[index]
        loaned = self.borrowed[index][borrow.job_id]
        own = 0.0
        if loaned.lender is None:
            own = len(loaned.units) * (now - loaned.since)
            pool.release(borrow.job_id, loaned.units)
            self.allocations.append(Allocation(pool.name, loaned.units, loaned.since, now))
            del self.launches[index][borrow.job_id], self.borrowed[index][borrow.job_id]
        else:
            self._unlend(index, loaned, now)
            loaned.ended = True
        trajectory = self.workload.trajectories[borrow.pending.live.trajectory].id
        record = launch_record(borrow, trajectory, pool.name, now, self.used(borrow, now))
        self.learn(index, borrow, record)
        return replace(record, held=own)

    def _finished(self, index: int, launch: Launch, lender: Lending | None,
                  now: float) -> ActionRecord:
        pool = self.pools[index]
        if lender is None:
            pool.release(launch.job_id, launch.units)
            del self.launches[index][launch.job_id]
            self.allocations.append(Allocation(pool.name, launch.units, launch.started, now))
        else:
            lender.progress(now)
            lender.done = True
            if not lender.lent:
                self._release(index, lender, now)
        trajectory = self.workload.trajectories[launch.pending.live.trajectory].id
        record = launch_record(launch, trajectory, pool.name, now, self.used(launch, now))
        self.learn(index, launch, record)
        return record

    def _release(self, index: int, lender: Lending, now: float) -> None:
        """A lender with no loans left gives its cores back."""
        pool = self.pools[index]
        job_id = lender.launch.job_id
        by_since: dict[float, list[int]] = {}
        for unit, since in lender.held_since.items():
            by_since.setdefault(since, []).append(unit)
        for since, units in sorted(by_since.items()):
            self.allocations.append(Allocation(pool.name, tuple(sorted(units)), since, now))
        pool.release(job_id, lender.launch.units)
        del self.launches[index][job_id], self.lending[index][job_id]


def _lent(lending: Lending | None) -> tuple[int, ...]:
    return () if lending is None else tuple(u for units in lending.lent.values() for u in units)


def _finish(lending: Lending | None, expected: float | None) -> float | None:
    """A running job's expected finish as the loan plan sees it: moved by its loans (a
    worker keeps the same estimate, see :func:`~tangram_celery.scheduling.lending.slowed`)."""
    return expected if lending is None or lending.done else lending.launch.finish


def _done(lending: Lending | None) -> bool:
    return lending is not None and lending.done
