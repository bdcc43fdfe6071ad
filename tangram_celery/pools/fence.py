"""Self-fencing: a worker that has not reached Redis for its TTL stops starting actions.

A CPU node's or GPU pool's heartbeat is how the others know it is alive. Once no heartbeat has
reached Redis for ``TANGRAM_NODE_TTL_S``, the others count the worker as dead (clients answer
the actions queued for a dead CPU node ``node_lost``), so the worker must count itself out too.
A :class:`Fence` watches the time since the last heartbeat that reached Redis (on a monotonic
clock, on a thread of its own, so a heartbeat hung on a cut link does not delay it). Past the
TTL the fence *closes*: no action starts (an admitted one waits at the fence with its units),
and with ``TANGRAM_FENCE_RUNNING=kill`` the running ones are killed (``on_close``). It opens
again only once the worker has registered anew: the first heartbeat that reaches Redis after
the fence closed registers the worker instead of renewing it. An action that waited at a
closed fence, or was received while it was closed, is looked up among the stored results
before it starts: if it was answered meanwhile it does not run, and its stored answer is
returned (:class:`~tangram_celery.errors.AlreadyAnswered`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from tangram_celery.errors import AlreadyAnswered

log = logging.getLogger(__name__)

CLOSED = -1
"""The mark of an action received while the fence was closed."""


class Fence:
    """The fence of one worker (see the module). Thread-safe."""

    def __init__(
        self, name: str, ttl_s: float,
        answered: Callable[[str], dict[str, Any] | None] | None = None,
        on_close: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.ttl_s = ttl_s
        self.closings = 0
        """How many times the fence has closed."""
        self._answered = answered
        self._on_close = on_close
        self._clock = clock
        self._cond = threading.Condition()
        self._last_ok = clock()
        self._closed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def closed(self) -> bool:
        """Whether the fence is closed now (after :meth:`check`)."""
        self.check()
        return self._closed

    def start(self) -> None:
        """Count the TTL from now and watch it on a daemon thread."""
        with self._cond:
            self._last_ok = self._clock()
        self._thread = threading.Thread(target=self._watch, name=f"tangram-fence-{self.name}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def check(self) -> bool:
        """Close the fence when the last heartbeat that reached Redis is older than the TTL;
        returns whether it is closed."""
        with self._cond:
            if self._closed or self._clock() - self._last_ok <= self.ttl_s:
                return self._closed
            self._closed = True
            self.closings += 1
        log.warning("%s: no heartbeat reached Redis for over %g s; fenced: no action starts "
                    "until it has registered again", self.name, self.ttl_s)
        if self._on_close is not None:
            try:
                self._on_close()
            except Exception:  # the fence stays closed whatever the callback does
                log.exception("%s: handling the running actions at fencing failed", self.name)
        return True

    def beat(self, renew: Callable[[], None], register: Callable[[], None]) -> None:
        """One heartbeat: ``register`` anew when the fence is closed (then open it), else
        ``renew``; either raises when Redis is not reached, which leaves the fence as it is."""
        closed = self.check()
        (register if closed else renew)()
        with self._cond:
            self._last_ok = self._clock()
            if closed:
                self._closed = False
                self._cond.notify_all()
        if closed:
            log.warning("%s: registered again; starting actions again", self.name)

    def mark(self) -> int:
        """What an action notes when it is received (:meth:`enter` takes it back)."""
        with self._cond:
            return CLOSED if self._closed else self.closings

    def enter(self, action_id: str, mark: int) -> None:
        """Wait until the fence is open; when it closed since ``mark``, raise
        :class:`AlreadyAnswered` if ``action_id`` was answered meanwhile."""
        self.check()
        with self._cond:
            while self._closed:
                self._cond.wait(0.5)
            fenced_since = mark == CLOSED or mark != self.closings
        if not fenced_since or self._answered is None:
            return
        stored = self._answered(action_id)
        if stored is not None:
            raise AlreadyAnswered(action_id, stored)

    def _watch(self) -> None:
        while not self._stop.wait(min(0.25, self.ttl_s / 4)):
            self.check()
