"""The core-loan runtime of a CPU node: who holds which cores, who waits, who borrows.

**Core loans** (with the robust scheduler, on a sandbox backend that can re-pin a running
action: ``repin``, the embedded bwrap backend with a writable cpuset controller): a short
action that the gate does not admit at once starts anyway, on a core lent by a running action
(`tangram_celery.scheduling.lending` chooses the lender), while its request waits in the gate
as before. The lender's cpuset shrinks to the cores it keeps and the borrower runs alone on
the lent core, so no core is ever in two actions' cpusets. When the gate admits the request,
the borrower moves onto the cores it was given and the lender has its core back; a borrower
that ends first gives the core back at once and releases its grant the moment it comes (a
request cannot be withdrawn from the gate). A lender that ends while it lends keeps its
allocation until its loans end (the gate releases an allocation as a whole). Without a lender
the action waits in the gate as before. `CoreLoans` keeps this state;
:class:`~tangram_celery.pools.cpu_pool.node.CpuNode` makes the loans.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tangram_celery.pools.admission import Request
from tangram_celery.scheduling import Job
from tangram_celery.scheduling.demand import job_class
from tangram_celery.scheduling.lending import Holder, Loan, LoanConfig, plan_loans, slowed


@dataclass
class Held:
    """An allocation from the gate as the node sees it: the trajectory, its unit ids and the
    host CPUs it runs on now, when it is expected to end (moved by its loans), whether it may
    lend, the units it lends now (borrower -> units), whether its action has ended (it then
    holds its units until its loans end), whether it ever lent (its duration then says little
    about its speed) and its closed loans (for the audit trail)."""

    trajectory_id: str
    units: tuple[int, ...]
    pinned: tuple[int, ...]
    expected_end: float | None
    lends: bool
    lent: dict[str, tuple[int, ...]] = field(default_factory=dict)
    ended: bool = False
    lent_ever: bool = False
    loans: list[dict[str, Any]] = field(default_factory=list)

    def holder(self, action_id: str) -> Holder:
        """The loan plan's view."""
        lent = tuple(u for units in self.lent.values() for u in units)
        return Holder(action_id, self.units, self.expected_end, lent,
                      self.lends and not self.ended)

    def kept(self) -> tuple[int, ...]:
        """The units it holds and has not lent."""
        lent = {u for units in self.lent.values() for u in units}
        return tuple(u for u in self.units if u not in lent)


@dataclass
class Bridge:
    """A borrower: its loan (None once over), the trajectory and host CPUs it runs on, when
    the loan began, its own units once the gate admits it, and whether its run has ended."""

    loan: Loan | None
    trajectory_id: str
    pinned: tuple[int, ...]
    since: float
    own: tuple[int, ...] | None = None
    ended: bool = False


Repin = Callable[[str, tuple[int, ...], tuple[int, ...]], bool]
"""A sandbox backend's ``repin(trajectory_id, cores, new_cores)``."""


class CoreLoans:
    """The loans of one node (thread-safe): who holds what, who waits, who borrows.

    `physical` maps unit ids to host CPUs; `repin` moves a running action's sandbox; the
    methods return the action ids whose allocation the caller must now release through the
    gate (a lender whose last loan ended after its action did, a borrower's late grant)."""

    def __init__(self, config: LoanConfig, repin: Repin | None,
                 physical: Callable[[Sequence[int]], tuple[int, ...]]) -> None:
        self.config = config
        self.repin = repin if config.enabled else None
        self.physical = physical
        self._lock = threading.Lock()
        self.held: dict[str, Held] = {}
        self._waiting: dict[str, Job] = {}
        self.bridges: dict[str, Bridge] = {}

    @contextmanager
    def waiting(self, action_id: str, job: Job) -> Iterator[None]:
        """While the block runs, the action waits for cores: loans are planned for every
        waiting action in queue order, so a later short action never borrows ahead of it."""
        with self._lock:
            self._waiting[action_id] = job
        try:
            yield
        finally:
            with self._lock:
                self._waiting.pop(action_id, None)

    def is_short(self, job: Job) -> bool:
        """Whether `job` is short enough to borrow (and so never lends)."""
        return job_class(job, self.config.short_s) == "short"

    def may_borrow(self, job: Job) -> bool:
        """Whether `job` (short, waiting) could borrow now."""
        if self.repin is None or not self.is_short(job):
            return False
        with self._lock:
            return bool(self._plan(job, set()))

    def hold(self, action_id: str, trajectory_id: str, request: Request,
             units: tuple[int, ...], lends: bool) -> None:
        """An allocation from the gate (a possible lender if `lends`)."""
        expected = dict(request.options).get(len(units))
        with self._lock:
            self.held[action_id] = Held(trajectory_id, units, self.physical(units),
                                        None if expected is None else time.time() + expected,
                                        lends)

    def borrow(self, job: Job, trajectory_id: str) -> Loan | None:
        """A loan for `job` (its request then waits in the gate without it): the lender's
        cpuset shrinks to the cores it keeps. A lender whose sandbox cannot be re-pinned (not
        started yet, or just ended) is passed over."""
        assert self.repin is not None
        refused: set[str] = set()
        with self._lock:
            while loans := self._plan(job, refused):
                loan = loans[0]
                lender = self.held[loan.lender]
                kept = self.physical([u for u in lender.kept() if u not in loan.units])
                if not self.repin(lender.trajectory_id, lender.pinned, kept):
                    refused.add(loan.lender)
                    continue
                now = time.time()
                self._retime(lender, now, len(loan.units))
                lender.pinned = kept
                lender.lent[job.job_id] = loan.units
                lender.lent_ever = True
                self.bridges[job.job_id] = Bridge(loan, trajectory_id,
                                                  self.physical(loan.units), now)
                return loan
        return None

    def admitted(self, action_id: str, request: Request, units: tuple[int, ...]
                 ) -> tuple[list[str], dict[str, Any] | None]:
        """The gate admitted a borrower's request: it moves onto `units` and its loan ends;
        if its run has ended already, its grant is to be released at once. Returns the
        allocations to release and the closed loan's audit entry."""
        assert self.repin is not None
        with self._lock:
            bridge = self.bridges[action_id]
            if bridge.ended:
                del self.bridges[action_id]
                return [action_id], None
            pinned = self.physical(units)
            moved = self.repin(bridge.trajectory_id, bridge.pinned, pinned)
            expected = dict(request.options).get(len(units))
            self.held[action_id] = Held(bridge.trajectory_id, units,
                                        pinned if moved else bridge.pinned,
                                        None if expected is None else time.time() + expected,
                                        False)
            bridge.own = units
            if not moved:  # its sandbox is not running yet: it stays on the lent core
                return [], None
            bridge.pinned = pinned
            return self._end_loan(action_id, bridge)

    def ended(self, action_id: str) -> tuple[list[str], dict[str, Any] | None]:
        """A borrower's run ended: its loan (if any) ends; returns the allocations to release
        (its own, once admitted) and the closed loan's audit entry."""
        with self._lock:
            bridge = self.bridges[action_id]
            bridge.ended = True
            release, entry = self._end_loan(action_id, bridge)
            if bridge.own is not None:
                del self.bridges[action_id]
                release.append(action_id)
            return release, entry

    def close(self, action_id: str) -> dict[str, Any] | None:
        """An allocation's action ended: None if it lends (it is released when its last
        loan ends), else its audit extras (the loans it made)."""
        with self._lock:
            held = self.held.get(action_id)
            if held is not None and held.lent:
                held.ended = True
                return None
            self.held.pop(action_id, None)
            return {"lent": held.loans} if held is not None and held.loans else {}

    def resized(self, action_id: str, units: tuple[int, ...]) -> bool:
        """A malleable run that does not lend now holds ``units`` (it grew or gave cores
        back); False, changing nothing, when it is not held or lends."""
        with self._lock:
            held = self.held.get(action_id)
            if held is None or held.lent:
                return False
            held.units, held.pinned = tuple(units), self.physical(units)
            return True

    def lent_ever(self, action_id: str) -> bool:
        """Whether the action's allocation ever lent a core."""
        with self._lock:
            held = self.held.get(action_id)
            return held is not None and held.lent_ever

    def _plan(self, job: Job, refused: set[str]) -> tuple[Loan, ...]:
        """The loan `job` would get now from a lender not in `refused` (lock held)."""
        holders = [held.holder(action_id) for action_id, held in self.held.items()
                   if action_id not in refused]
        waiting = [*self._waiting.values(), job] if job.job_id not in self._waiting else \
            list(self._waiting.values())
        return plan_loans(waiting, holders, time.time(), self.config, {job.job_id})

    def _end_loan(self, borrower: str, bridge: Bridge) -> tuple[list[str], dict[str, Any] | None]:
        """Give a borrower's lent units back to its lender (lock held)."""
        loan, bridge.loan = bridge.loan, None
        if loan is None:
            return [], None
        now = time.time()
        entry = {"action_id": borrower, "units": list(loan.units), "start": bridge.since,
                 "end": now, "lent_by": loan.lender}
        lender = self.held[loan.lender]
        self._retime(lender, now, -len(loan.units))
        del lender.lent[borrower]
        lender.loans.append({k: v for k, v in entry.items() if k != "lent_by"})
        if lender.ended:
            return ([loan.lender] if not lender.lent else []), entry
        kept = self.physical(lender.kept())
        assert self.repin is not None
        if self.repin(lender.trajectory_id, lender.pinned, kept):
            lender.pinned = kept
        return [], entry

    @staticmethod
    def _retime(lender: Held, now: float, more: int) -> None:
        """A lender lends `more` units (fewer if negative): its expected end moves."""
        lent = sum(map(len, lender.lent.values()))
        lender.expected_end = slowed(lender.expected_end, now, len(lender.units), lent,
                                     lent + more)
