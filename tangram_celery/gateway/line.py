"""The gateway's line for a full pool: requests that find no room wait in arrival order.

While no CPU node has memory left for another trajectory, the client's submit raises
:class:`~tangram_celery.errors.NoCapacityError`. :class:`CapacityLine` turns that into a wait:
the first request in line retries (briefly apart), the others wait behind it, so a burst is
served first come, first served instead of by whichever retry happens to land.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TypeVar

from tangram_celery.errors import NoCapacityError

T = TypeVar("T")
RETRY_S = (0.01, 0.1)
"""First and longest pause between the first-in-line request's tries."""


class CapacityLine:
    """Arrival-ordered waiting for room on the pool; thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._clock = clock
        self._sleep = sleep
        self._cond = threading.Condition()
        self._line: deque[object] = deque()

    def __len__(self) -> int:
        with self._cond:
            return len(self._line)

    def attempt(self, submit: Callable[[], T], deadline: float) -> T:
        """``submit()``, waiting in line while it raises :class:`NoCapacityError`; raises it
        again once ``deadline`` (on the clock) has passed."""
        with self._cond:
            empty = not self._line
        if empty:
            try:
                return submit()
            except NoCapacityError:
                pass
        ticket = object()
        with self._cond:
            self._line.append(ticket)
        try:
            return self._retry_first(ticket, submit, deadline)
        finally:
            with self._cond:
                self._line.remove(ticket)
                self._cond.notify_all()

    def _retry_first(self, ticket: object, submit: Callable[[], T], deadline: float) -> T:
        pause = RETRY_S[0]
        while True:
            with self._cond:
                while self._line[0] is not ticket:
                    left = deadline - self._clock()
                    if left <= 0:
                        raise NoCapacityError("no CPU node had room for the request's "
                                              "trajectory before its wait ran out "
                                              "(TANGRAM_GATEWAY_WAIT_S); add nodes or memory")
                    self._cond.wait(min(left, 1.0))
            try:
                return submit()
            except NoCapacityError:
                if self._clock() + pause > deadline:
                    raise
                self._sleep(pause)
                pause = min(pause * 2, RETRY_S[1])
