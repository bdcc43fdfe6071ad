"""One clock for stamps taken on different hosts: the broker's.

An action's stamps come from two machines: the client stamps ``submitted``, ``published`` and
``completed``, the worker ``received`` to ``stored``. Their wall clocks may differ by hundreds of
milliseconds, and the ACT's ``queue`` (worker ``admitted`` minus client ``published``) and
``overhead`` would carry the difference. So every process puts its stamps on the clock of the
one machine they all talk to, the Redis server: it reads Redis ``TIME`` a few times, keeps the
sample with the shortest round trip, and takes the offset of its own clock from the broker's at
that sample's midpoint (the error is at most half that round trip, well under a millisecond on
a LAN). An offset within that error is taken as zero, so processes whose clocks agree (one host,
or hosts synchronized by NTP) keep their stamps exactly. Node and pool heartbeats, and their
liveness, use Redis ``TIME`` itself.

Durations (``exec_s``, ``setup_s``, ``sched_s``) are measured on one host's monotonic clock and
never need this. ``TANGRAM_CLOCK_SKEW_S`` is a **test-only** hook: it adds a fixed offset to this
process's wall-clock readings, as a skewed host would have, so a test can show that the broker
clock cancels it.

:func:`estimate_offset` and :func:`shifted` are pure; :class:`BrokerClock` is the edge.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import redis

WORKER_STAMPS = ("received", "admitted", "exec_started", "exec_finished", "stored")
"""The stamps a worker takes (the rest are the client's or durations)."""

SAMPLES = 8
BROKER_RESOLUTION_S = 1e-6
RESYNC_S = 60.0


@dataclass(frozen=True)
class Offset:
    """How far this process's clock is ahead of the broker's, and the bound on that estimate."""

    offset_s: float
    error_s: float

    @property
    def correction_s(self) -> float:
        """What to subtract from this process's readings: the offset, or 0 when it is within
        the estimate's error (clocks that agree, e.g. on one host, are never moved by noise)."""
        return self.offset_s if abs(self.offset_s) > self.error_s else 0.0


UNMEASURED = Offset(0.0, -1.0)
"""What a process uses before the broker ever answered its ``TIME``: no correction, error
``-1`` (unknown)."""


def estimate_offset(samples: Iterable[tuple[float, float, float]]) -> Offset:
    """The offset from samples ``(local before, broker, local after)``: the one with the
    shortest round trip, local midpoint minus broker time, error half its round trip plus the
    broker clock's resolution (``TIME`` gives microseconds)."""
    before, broker, after = min(samples, key=lambda s: s[2] - s[0])
    return Offset((before + after) / 2 - broker, (after - before) / 2 + BROKER_RESOLUTION_S)


def shifted(result: Mapping[str, Any], shift_s: float, offset: Offset) -> dict[str, Any]:
    """``result`` (an ActionResult's JSON) with its worker stamps moved by ``shift_s`` onto the
    broker's clock and the offset recorded in ``timings``; unset (zero) stamps stay zero."""
    timings = result.get("timings")
    if not isinstance(timings, Mapping):
        return dict(result)
    moved = {k: (v + shift_s if k in WORKER_STAMPS and isinstance(v, int | float) and v else v)
             for k, v in timings.items()}
    moved["clock_offset_s"] = offset.offset_s
    moved["clock_error_s"] = offset.error_s
    return {**result, "timings": moved}


def broker_time(client: redis.Redis) -> float:
    """The Redis server's clock now (``TIME``), in seconds."""
    seconds, micros = client.time()
    return float(seconds) + float(micros) / 1e6


class BrokerClock:
    """This process's wall clock, read on the broker's clock (thread-safe).

    ``skew_s`` is the test-only offset added to every local reading (``TANGRAM_CLOCK_SKEW_S``).
    The offset is estimated on first use and again every ``resync_s`` seconds; while Redis does
    not answer, the last estimate is kept.
    """

    def __init__(self, client: redis.Redis, skew_s: float = 0.0,
                 resync_s: float = RESYNC_S) -> None:
        self._redis = client
        self.skew_s = skew_s
        self.resync_s = resync_s
        self._lock = threading.Lock()
        self._offset: Offset | None = None
        self._synced = 0.0

    def local(self) -> float:
        """This process's wall clock (with the test-only skew)."""
        return time.time() + self.skew_s

    def offset(self) -> Offset:
        """The current estimate (re-estimated when older than ``resync_s``)."""
        with self._lock:
            due = self._offset is None or time.monotonic() - self._synced >= self.resync_s
            if due:
                try:
                    self._offset = self._measure()
                    self._synced = time.monotonic()
                except redis.RedisError:
                    if self._offset is None:
                        return UNMEASURED
            assert self._offset is not None
            return self._offset

    def now(self) -> float:
        """The broker's clock now, as read here."""
        return self.local() - self.offset().correction_s

    def shift_s(self) -> float:
        """What to add to a plain ``time.time()`` stamp of this process to put it on the
        broker's clock."""
        return self.skew_s - self.offset().correction_s

    def _measure(self) -> Offset:
        samples = []
        for _ in range(SAMPLES):
            before = self.local()
            broker = broker_time(self._redis)
            samples.append((before, broker, self.local()))
        return estimate_offset(samples)
