"""Ready sandboxes of the embedded backend: a few started ahead, so a first action costs no start.

Each ready sandbox already holds a uid from the pool, an empty work dir (mode 0700, owned by
that uid) and a running warm executor bound to it. A new trajectory takes one: its home is
renamed to the trajectory's name (the sandbox's bind mount follows the directory), and a
background thread starts a replacement. Nothing of one trajectory is ever handed to another:
a ready sandbox is used once, and ended trajectories are never put back.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from tangram_celery.errors import SandboxError
from tangram_celery.sandbox.bwrap.trajectory import Trajectory

log = logging.getLogger(__name__)
READY_PREFIX = "ready-"


class ReadyPool:
    """Keeps ``size`` started sandboxes; thread-safe.

    ``make()`` builds one (a :class:`Trajectory` with its uid, work dir and executor) and
    ``discard(traj)`` disposes of one that was never taken.
    """

    def __init__(self, size: int, make: Callable[[], Trajectory],
                 discard: Callable[[Trajectory], None]) -> None:
        self.size = size
        self._make = make
        self._discard = discard
        self._ready: list[Trajectory] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        if size > 0:
            self._thread = threading.Thread(target=self._fill, name="tangram-ready-sandboxes",
                                            daemon=True)
            self._thread.start()

    def take(self, home: Path, trajectory_id: str) -> Trajectory | None:
        """A ready sandbox, its home renamed to ``home``, for ``trajectory_id``; None when none
        is ready."""
        with self._lock:
            ready = self._ready.pop() if self._ready else None
        self._wake.set()
        if ready is None:
            return None
        try:
            ready.home.rename(home)
        except OSError:
            threading.Thread(target=self._discard, args=(ready,), daemon=True).start()
            return None
        ready.trajectory_id, ready.home = trajectory_id, home
        return ready

    def count(self) -> int:
        """How many sandboxes are ready now."""
        with self._lock:
            return len(self._ready)

    def _fill(self) -> None:
        failures = 0
        while True:
            with self._lock:
                if self._closed:
                    return
                short = len(self._ready) < self.size
            if not short or failures >= 3:
                self._wake.wait(5.0 if short else None)
                self._wake.clear()
                failures = 0
                continue
            try:
                made = self._make()
            except (SandboxError, OSError):
                failures += 1
                log.warning("could not start a ready sandbox", exc_info=True)
                continue
            failures = 0
            with self._lock:
                keep = not self._closed
                if keep:
                    self._ready.append(made)
            if not keep:
                self._discard(made)

    def close(self) -> None:
        """Stop filling and dispose of every ready sandbox."""
        with self._lock:
            self._closed = True
            ready, self._ready = self._ready, []
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30.0)
        for traj in ready:
            with contextlib.suppress(Exception):
                self._discard(traj)
