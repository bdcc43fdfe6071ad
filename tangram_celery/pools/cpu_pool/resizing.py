"""A CPU node's malleable runs: it grows and shrinks them while they run.

With ``TANGRAM_MALLEABLE_RESIZE`` on (the default), on a sandbox backend that can re-pin a
running action and reach the runs inside its sandboxes (bubblewrap through the work dir on the
host, Docker through ``docker exec``), a node resizes the malleable test runs it holds: its
elastic pytest actions, unless they say ``"malleable": false`` or are known to be too short
(:func:`resized_run`). At every event (an action
waits in the gate, is admitted or ends) and every ``TANGRAM_MALLEABLE_TICK_S`` (the runs'
progress), one step asks each run its state through its control socket, hands the plain data
to :func:`tangram_celery.scheduling.malleable.decide_resize` and carries out the decision. A
step for an action that waits decides on the runs' last answers instead, so the action never
waits for their round trips:

* **shrink**, for the waiting actions: the run's cpuset narrows at once
  (:class:`~tangram_celery.sandbox.malleable.CoreResizer`), the core goes back to the gate,
  which admits the waiting action on it in the same call, and only then is the run asked to
  retire a worker after its current test. A core none of the run's workers will take a test on
  (its queue is drained) is taken back the same way, without asking.
* **grow**, onto cores free while nothing waits: the gate gives the core to the run first, then
  its cpuset widens and the run starts a worker; when either refuses the core goes back.

So a core is in one action's cpuset at a time, and the gate's records (closed and reopened at
each change) say which. The inputs: each run's cores, its tests and tests done, the
core-seconds it held so far and its signature's learned single-core duration.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tangram_celery.action import Action
from tangram_celery.pools.admission import Admission, AllocationRecord, Request
from tangram_celery.sandbox import SandboxBackend
from tangram_celery.sandbox.base import ReachesRuns, RunControl
from tangram_celery.sandbox.malleable import CoreResizer, is_pytest_command, resize
from tangram_celery.scheduling.malleable import (
    MalleableRun,
    ResizeConfig,
    ResizeDecision,
    ResizeInputs,
    Waiting,
    decide_resize,
    worth_malleable,
)

log = logging.getLogger(__name__)

STATUS_TIMEOUT_S = 2.0
"""How long one step waits for a run's answer."""


@runtime_checkable
class WorkdirBackend(Protocol):
    """A sandbox backend that says where a trajectory's work dir is on the host."""

    def host_workdir(self, trajectory_id: str) -> Path | None:
        """The trajectory's work dir on the host (None: it holds none)."""
        ...


@dataclass
class Tracked:
    """A malleable run as the node holds it: its action, units, control socket (its name in
    the work dir), learned single-core duration, the core-seconds held so far, whether it was
    ever resized, and whether it may still grow (not after a refused grow: a sandbox without a
    writable cpuset, a run that ends)."""

    action_id: str
    trajectory_id: str
    units: list[int]
    control: str
    expected_core_s: float | None
    since: float
    core_s: float = 0.0
    resized: bool = False
    grows: bool = True
    resizer: CoreResizer | None = None
    began: float = 0.0
    status: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.began = self.began or self.since

    def held_core_s(self, now: float) -> float:
        """Core-seconds held up to ``now``."""
        return self.core_s + len(self.units) * max(0.0, now - self.since)

    def changed(self, units: list[int], now: float) -> None:
        """It holds ``units`` from ``now`` on."""
        self.core_s = self.held_core_s(now)
        self.since = now
        self.units = units
        self.resized = True


def run_view(tracked: Tracked, status: Mapping[str, Any], now: float) -> MalleableRun:
    """The policy's view of a run from its control socket's ``status`` answer: its cores
    (the units it holds), its tests, and its tests done, counting those its workers hold
    beyond the queue's (a worker holds the next id ahead), so that a new worker is only
    wanted for ids still queued (for none once it refused to grow)."""
    tests = int(status.get("tests") or 0)
    done = int(status.get("done") or 0)
    queued = 0 if not tracked.grows else status.get("queued")
    if queued is not None:
        done = max(done, tests - int(queued) - len(tracked.units))
    return MalleableRun(tracked.action_id, len(tracked.units), tests,
                        max(0, min(done, tests)), tracked.held_core_s(now),
                        tracked.expected_core_s)


def idle_cores(tracked: Tracked, status: Mapping[str, Any]) -> int:
    """Cores the run holds beyond its workers that will take more tests (at least one kept)."""
    active = status.get("active")
    return 0 if active is None else max(0, len(tracked.units) - max(1, int(active)))


def resize_inputs(free: int, runs: Sequence[MalleableRun], waiting: Sequence[Request]
                  ) -> ResizeInputs:
    """The plain data of one decision: the free cores, the runs, the gate's waiting requests
    (each at its minimum)."""
    return ResizeInputs(free, tuple(runs), tuple(Waiting(r.id, r.min_units) for r in waiting))


class MalleableRuns:
    """The node's malleable runs and the thread that resizes them.

    ``physical`` maps a unit to its host CPU (units may share one: a run's cpuset is then the
    set of its units' CPUs, and a unit taken back can leave its CPU in it); ``audit`` records a
    closed allocation record; ``resized`` tells the loan book a run's new units."""

    def __init__(self, admission: Admission, sandbox: SandboxBackend,
                 physical: Callable[[int], int], config: ResizeConfig, tick_s: float,
                 audit: Callable[[AllocationRecord], None],
                 resized: Callable[[str, tuple[int, ...]], object]) -> None:
        self.admission = admission
        self.sandbox = sandbox
        self.physical = physical
        self.config = config
        self.tick_s = tick_s
        self.audit = audit
        self.resized = resized
        self.runs: dict[str, Tracked] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the resizing thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="tangram-malleable",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the resizing thread."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def poke(self) -> None:
        """An event: the thread takes a step now."""
        self._wake.set()

    def add(self, action_id: str, trajectory_id: str, units: tuple[int, ...], control: str,
            expected_core_s: float | None) -> None:
        """A malleable run admitted on ``units``, its control socket ``control`` in its work
        dir."""
        with self._lock:
            self.runs[action_id] = Tracked(action_id, trajectory_id, list(units), control,
                                           expected_core_s, time.time())
        self.poke()

    def remove(self, action_id: str) -> None:
        """The run ended (no step resizes it from now on); idempotent."""
        self.ended(action_id, 0)

    def ended(self, action_id: str, units: int) -> int:
        """The run ended (no step resizes it from now on): the whole number of cores it held on
        average since its admission when it was resized (what its duration is learned at),
        else ``units``."""
        with self._lock:
            tracked = self.runs.pop(action_id, None)
        self.poke()
        if tracked is None or not tracked.resized:
            return units
        now = time.time()
        return max(1, round(tracked.held_core_s(now) / max(now - tracked.began, 1e-9)))

    def step(self, fresh: bool = True) -> ResizeDecision | None:
        """Decide and resize; the decision (None: no run answered). ``fresh``: ask every run
        its state first; else decide on the last answers (when every run gave one), so that an
        action that waits for a core is not kept waiting for the runs' round trips (cores then
        only go to it)."""
        with self._lock:
            fresh = fresh or any(t.status is None for t in self.runs.values())
            statuses = self._statuses() if fresh else self._last_statuses()
            if fresh:
                for action_id, status in statuses.items():
                    self._give_back_idle(self.runs[action_id],
                                         idle_cores(self.runs[action_id], status))
            now = time.time()
            views = {a: run_view(self.runs[a], s, now) for a, s in statuses.items()}
            if not views:
                return None
            decision = decide_resize(resize_inputs(
                len(self.admission.free_units()), list(views.values()),
                self.admission.waiting_requests()), self.config)
            taken = {a: self._take(self.runs[a], n) for a, n in decision.shrink.items()}
            if fresh and not self.admission.waiting_requests():
                for action_id, count in decision.grow.items():
                    self._grow(self.runs[action_id], count)
            for action_id, count in taken.items():
                self._retire(self.runs[action_id], count)
            return decision

    def _loop(self) -> None:
        while not self._stop.is_set():
            poked = self._wake.wait(self.tick_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.step(fresh=not (poked and self.admission.waiting_requests()))
            except Exception:  # a failed step must not end the thread
                log.warning("a malleable resize step failed", exc_info=True)

    def _statuses(self) -> dict[str, dict[str, Any]]:
        """Each run's ``status`` answer (runs that do not answer yet, or any more, left out)."""
        statuses: dict[str, dict[str, Any]] = {}
        for tracked in self.runs.values():
            resizer = self._resizer(tracked)
            if resizer is None:
                continue
            try:
                statuses[tracked.action_id] = resizer.control("status", STATUS_TIMEOUT_S)
            except (OSError, ValueError):
                continue
            tracked.status = statuses[tracked.action_id]
        return statuses

    def _last_statuses(self) -> dict[str, dict[str, Any]]:
        """Each run's last ``status`` answer (runs that never answered left out)."""
        return {a: t.status for a, t in self.runs.items() if t.status is not None}

    def _resizer(self, tracked: Tracked) -> CoreResizer | None:
        if tracked.resizer is None:
            control = run_control(self.sandbox, tracked.trajectory_id, tracked.control)
            if control is not None:
                tracked.resizer = CoreResizer(
                    self.sandbox, tracked.trajectory_id,
                    tuple(self.physical(u) for u in tracked.units), control)
        return tracked.resizer

    def _give_back_idle(self, tracked: Tracked, count: int) -> None:
        """Take back, from the cpuset alone, cores no worker of the run will take a test on."""
        resizer = tracked.resizer
        assert resizer is not None
        for _ in range(count):
            if resizer.take() is None:
                return
            self._change(tracked, tracked.units[:-1])

    def _take(self, tracked: Tracked, count: int) -> int:
        """Take up to ``count`` cores back at once, each to the gate, which admits a waiter
        on it; how many it took."""
        resizer = tracked.resizer
        assert resizer is not None
        for taken in range(count):
            if resizer.take() is None:
                return taken
            self._change(tracked, tracked.units[:-1])
        return count

    def _retire(self, tracked: Tracked, count: int) -> None:
        """Ask the run to retire ``count`` workers, for the cores taken from it."""
        resizer = tracked.resizer
        assert resizer is not None
        for _ in range(count):
            resizer.retire()

    def _grow(self, tracked: Tracked, count: int) -> None:
        resizer = tracked.resizer
        assert resizer is not None
        for unit in self.admission.free_units()[:count]:
            units = [*tracked.units, unit]
            if not self._change(tracked, units):
                return
            if not resizer.grow(self.physical(unit)):
                self._change(tracked, units[:-1])
                tracked.grows = False
                return

    def _change(self, tracked: Tracked, units: list[int]) -> bool:
        closed = self.admission.resize(tracked.action_id, tuple(units))
        if closed is None:
            return False
        tracked.changed(units, time.time())
        self.resized(tracked.action_id, tuple(units))
        self.audit(closed)
        return True


def run_control(sandbox: SandboxBackend, trajectory_id: str, name: str) -> RunControl | None:
    """How the node reaches the malleable run listening at ``name`` in the work dir of
    ``trajectory_id`` (None: not now): the backend's own way, else the socket in the work dir
    on the host once it is there."""
    if isinstance(sandbox, ReachesRuns):
        return sandbox.run_control(trajectory_id, name)
    if isinstance(sandbox, WorkdirBackend):
        workdir = sandbox.host_workdir(trajectory_id)
        if workdir is not None and (workdir / name).exists():
            return partial(resize, str(workdir / name))
    return None


def reaches_runs(sandbox: SandboxBackend) -> bool:
    """Whether the node can reach the malleable runs in ``sandbox``'s sandboxes."""
    return isinstance(sandbox, (ReachesRuns, WorkdirBackend))


def resized_run(action: Action, single_s: float | None, config: ResizeConfig) -> bool:
    """Whether a node that resizes runs resizes ``action`` while it runs: its one command runs
    pytest (no steps, nothing to fetch) and
    :func:`~tangram_celery.scheduling.malleable.worth_malleable` says so, over its
    ``"malleable"`` flag, whether its cores are elastic and its learned single-core duration
    ``single_s``."""
    payload = action.payload
    if "steps" in payload or payload.get("fetch") \
            or not is_pytest_command(str(payload.get("cmd", ""))):
        return False
    asked = payload.get("malleable")
    return worth_malleable(asked if isinstance(asked, bool) else None,
                           action.cost[action.key_resource].elastic, single_s,
                           config.worker_start_s)
