"""The node-side admission gate: worker threads wait here, FCFS, until they are given units.

A node worker's prefetch window delivers messages to threads; each thread calls
:meth:`Admission.acquire`, which blocks until the placement policy grants it concrete unit ids
(core ids on a CPU node, GPU ids on a GPU pool). The policy is a pure function re-run whenever an
action arrives or finishes. Every grant is recorded so that exclusivity can be checked later.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from tangram_celery.errors import TangramError


@dataclass(frozen=True)
class Request:
    """One action waiting for units: its allowed unit counts with expected durations, and
    the GPU service (model) it runs on, for policies that know residency."""

    id: str
    options: tuple[tuple[int, float | None], ...]
    arrived: float
    signature: str = ""
    service: str = ""

    @property
    def min_units(self) -> int:
        """The smallest allowed unit count."""
        return self.options[0][0]


@dataclass(frozen=True)
class Running:
    """An admitted action: its units, when it is expected to finish, its service (if any)."""

    id: str
    units: tuple[int, ...]
    started: float
    expected_end: float | None
    service: str = ""


@dataclass(frozen=True)
class PoolState:
    """Everything the placement policy sees at one scheduling point."""

    waiting: tuple[Request, ...]
    free: tuple[int, ...]
    running: tuple[Running, ...]
    total: int
    now: float


Grant = tuple[str, tuple[int, ...]]
Policy = Callable[[PoolState], Sequence[Grant]]


def fcfs_minimum(state: PoolState) -> list[Grant]:
    """Strict FCFS at each action's minimum: grant the head while it fits, stop at the first that
    does not (so nothing behind it can overtake it and starve it)."""
    free = list(state.free)
    grants: list[Grant] = []
    for request in state.waiting:
        need = request.min_units
        if need > len(free):
            break
        grants.append((request.id, tuple(free[:need])))
        free = free[need:]
    return grants


@dataclass
class AllocationRecord:
    """One grant of units to an action, closed when the action releases them."""

    action_id: str
    units: tuple[int, ...]
    start: float
    end: float | None = None


@dataclass
class _Slot:
    request: Request
    event: threading.Event = field(default_factory=threading.Event)
    units: tuple[int, ...] = ()


class Admission:
    """A thread-safe pool of exclusive units with FCFS admission through a pure policy."""

    def __init__(
        self,
        units: Sequence[int],
        policy: Policy = fcfs_minimum,
        clock: Callable[[], float] = time.time,
        history: int = 100_000,
        on_wait: Callable[[], None] | None = None,
    ) -> None:
        if not units:
            raise TangramError("a pool needs at least one unit")
        self._all = tuple(units)
        self._free = list(units)
        self._policy = policy
        self._clock = clock
        self._lock = threading.Lock()
        self._waiting: list[_Slot] = []
        self._running: dict[str, Running] = {}
        self._history = history
        self.records: list[AllocationRecord] = []
        self._open: dict[str, AllocationRecord] = {}
        self._decided: dict[str, float] = {}
        self.on_wait = on_wait
        """Called (outside the lock) when a request arrives that is not admitted at once."""
        self.policy_calls = 0
        """Policy calls so far."""
        self.policy_s = 0.0
        """Wall seconds spent in the policy so far (its share of ACT is the scheduling cost)."""

    @property
    def total(self) -> int:
        """Number of units in the pool."""
        return len(self._all)

    def free_count(self) -> int:
        """Units not held by a running action."""
        with self._lock:
            return len(self._free)

    def waiting_count(self) -> int:
        """Actions waiting for units."""
        with self._lock:
            return len(self._waiting)

    def acquire(self, request: Request, timeout: float | None = None) -> tuple[int, ...]:
        """Block until ``request`` is granted units; returns the unit ids.

        Raises :class:`TangramError` if ``request`` can never fit this pool, or ``TimeoutError``.
        """
        if request.min_units > len(self._all):
            raise TangramError(
                f"action {request.id} needs at least {request.min_units} units but this pool has "
                f"{len(self._all)}; lower its minimum or route it to a larger node"
            )
        slot = _Slot(request)
        with self._lock:
            self._waiting.append(slot)
            self._schedule_locked()
        if self.on_wait is not None and not slot.event.is_set():
            self.on_wait()
        if not slot.event.wait(timeout):
            with self._lock:
                if not slot.event.is_set():
                    self._waiting.remove(slot)
                    raise TimeoutError(f"action {request.id} was not admitted in {timeout} s")
        return slot.units

    def release(self, action_id: str) -> AllocationRecord | None:
        """Give an action's units back and admit whoever now fits; returns the closed record."""
        with self._lock:
            running = self._running.pop(action_id, None)
            if running is None:
                return None
            self._free.extend(running.units)
            self._free.sort()
            record = self._open.pop(action_id, None)
            if record is not None:
                record.end = self._clock()
            self._schedule_locked()
            return record

    def free_units(self) -> tuple[int, ...]:
        """The units no running action holds, in order."""
        with self._lock:
            return tuple(self._free)

    def waiting_requests(self) -> tuple[Request, ...]:
        """The requests waiting for units, in arrival order."""
        with self._lock:
            return tuple(s.request for s in self._waiting)

    def resize(self, action_id: str, units: tuple[int, ...]) -> AllocationRecord | None:
        """Change a running action's units to ``units`` (a malleable run grows or shrinks):
        added units must be free, dropped ones become free and the waiting actions that now
        fit are admitted. Its allocation record so far is closed (returned) and a new one opens
        with ``units``; None, changing nothing, when it does not run or the units are taken."""
        with self._lock:
            running = self._running.get(action_id)
            if running is None or not units or len(set(units)) != len(units):
                return None
            added = set(units) - set(running.units)
            if not added <= set(self._free):
                return None
            dropped = set(running.units) - set(units)
            self._free = sorted((set(self._free) - added) | dropped)
            self._running[action_id] = replace(running, units=tuple(units))
            now = self._clock()
            closed = self._open.pop(action_id, None)
            if closed is not None:
                closed.end = now
            self._record_locked(action_id, tuple(units), now)
            self._schedule_locked()
            return closed

    def postpone(self, action_id: str, seconds: float) -> None:
        """Expect ``action_id``'s run to end ``seconds`` later than its duration says (a GPU
        pool adds the restore its grant triggers), so later decisions see when its units will
        really be free."""
        with self._lock:
            running = self._running.get(action_id)
            if running is not None and running.expected_end is not None and seconds > 0:
                self._running[action_id] = replace(running,
                                                   expected_end=running.expected_end + seconds)

    def decision_s(self, action_id: str) -> float:
        """Wall seconds of the policy call that granted ``action_id`` its units (0 if none
        did: it joined a batch or was never admitted); asked once, after ``acquire``."""
        with self._lock:
            return self._decided.pop(action_id, 0.0)

    def hand_over(self, action_ids: Sequence[str], units: tuple[int, ...]) -> list[str]:
        """Wake the waiting actions ``action_ids`` with ``units`` that a running action already
        holds (they join its batch: the units stay that action's and nothing is recorded for
        them); returns the ids that were still waiting, in the order given."""
        wanted = set(action_ids)
        with self._lock:
            handed = {s.request.id: s for s in self._waiting if s.request.id in wanted}
            for slot in handed.values():
                self._waiting.remove(slot)
                slot.units = units
                slot.event.set()
            self._schedule_locked()
        return [a for a in action_ids if a in handed]

    def _schedule_locked(self) -> None:
        if not self._waiting or not self._free:
            return
        now = self._clock()
        state = PoolState(
            waiting=tuple(s.request for s in self._waiting),
            free=tuple(self._free),
            running=tuple(self._running.values()),
            total=len(self._all),
            now=now,
        )
        by_id = {s.request.id: s for s in self._waiting}
        began = time.perf_counter()
        grants = self._policy(state)
        spent = time.perf_counter() - began
        self.policy_calls += 1
        self.policy_s += spent
        for action_id, units in grants:
            self._grant_locked(by_id[action_id], units, now)
            self._decided[action_id] = spent

    def _grant_locked(self, slot: _Slot, units: tuple[int, ...], now: float) -> None:
        taken = set(units)
        if not units or not taken <= set(self._free) or len(taken) != len(units):
            raise TangramError(f"policy granted unavailable units {units} to {slot.request.id}")
        self._free = [u for u in self._free if u not in taken]
        self._waiting.remove(slot)
        expected = dict(slot.request.options).get(len(units))
        self._running[slot.request.id] = Running(
            slot.request.id, units, now, None if expected is None else now + expected,
            slot.request.service,
        )
        self._record_locked(slot.request.id, units, now)
        slot.units = units
        slot.event.set()

    def _record_locked(self, action_id: str, units: tuple[int, ...], now: float) -> None:
        record = AllocationRecord(action_id, units, now)
        self._open[action_id] = record
        self.records.append(record)
        if len(self.records) > self._history:
            del self.records[: len(self.records) - self._history]
