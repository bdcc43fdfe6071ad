"""Recycled sandboxes: started sandboxes reused, wiped, by one-request trajectories.

A one-request trajectory (a gateway request without a trajectory name) leases a sandbox for its
actions. When the lease ends the sandbox is wiped on a thread of its own and goes back to the
pool; the next lease takes it with its uid, its cgroups and its warm executor already made. The
wipe (:func:`wiped`) leaves nothing of one request to the next:

- every process of the sandbox but its warm executor is killed and reaped (the executor is the
  sandbox's pid 1 and every process the request made is in its pid namespace), and the
  sandbox's cgroups are checked to hold no process beyond bubblewrap and the executor;
- its work dir, ``/tmp`` and ``/dev/shm`` are emptied and their modes reset, and its System V
  IPC objects removed (POSIX message queues are refused by the seccomp filter);
- the executor is checked to be alive and to have answered the wipe; it never runs user code
  itself (each action is a child it forks), so nothing an action does changes it.

A sandbox that cannot be wiped cleanly (its executor died or did not answer, a process
survived, a file could not be removed, its work dir went over its quota, it was ended) is
destroyed, not reused.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from tangram_celery.sandbox.bwrap.trajectory import Trajectory

log = logging.getLogger(__name__)
WIPE_TIMEOUT_S = 10.0


def wiped(traj: Trajectory) -> bool:
    """Wipe a sandbox whose lease ended; True when it is clean and may be reused."""
    executor = traj.executor
    if traj.ended or traj.exceeded or traj.active or traj.pins or executor is None:
        return False
    if not executor.alive() or not executor.wipe(WIPE_TIMEOUT_S):
        return False
    group = traj.group
    if group is not None and group.pids() - group.spare:
        return False
    return executor.alive()


class RecyclePool:
    """Keeps up to ``size`` wiped sandboxes; thread-safe.

    ``wipe(traj)`` says whether a returned sandbox is clean; ``discard(traj)`` destroys one
    that is not, or that the pool has no room for.
    """

    def __init__(self, size: int, wipe: Callable[[Trajectory], bool],
                 discard: Callable[[Trajectory], None]) -> None:
        self.size = size
        self._wipe = wipe
        self._discard = discard
        self._idle: list[Trajectory] = []
        self._lock = threading.Lock()
        self._closed = False
        self._wiper = ThreadPoolExecutor(1, thread_name_prefix="tangram-wipe")
        self.reused = 0
        self.destroyed = 0

    def take(self) -> Trajectory | None:
        """A wiped sandbox, or None when none is idle."""
        with self._lock:
            if not self._idle:
                return None
            self.reused += 1
            return self._idle.pop()

    def give_back(self, traj: Trajectory) -> None:
        """Wipe ``traj`` in the background, then keep it or destroy it."""
        try:
            self._wiper.submit(self._recycle, traj)
        except RuntimeError:
            self._destroy(traj)

    def idle(self) -> int:
        """How many wiped sandboxes wait now."""
        with self._lock:
            return len(self._idle)

    def _recycle(self, traj: Trajectory) -> None:
        try:
            clean = self.size > 0 and self._wipe(traj)
        except Exception:
            log.warning("could not wipe sandbox uid %s", traj.uid, exc_info=True)
            clean = False
        with self._lock:
            keep = clean and not self._closed and len(self._idle) < self.size
            if keep:
                self._idle.append(traj)
                return
        self._destroy(traj)

    def _destroy(self, traj: Trajectory) -> None:
        with self._lock:
            self.destroyed += 1
        with contextlib.suppress(Exception):
            self._discard(traj)

    def close(self) -> None:
        """Finish the wipes under way and destroy every idle sandbox."""
        with self._lock:
            self._closed = True
        self._wiper.shutdown(wait=True)
        with self._lock:
            idle, self._idle = self._idle, []
        for traj in idle:
            self._destroy(traj)
