"""The GPUs of one pool while its plan is made (`Board`): when each is free, and the holes
before later bookings that a job may backfill."""

from __future__ import annotations

import math
from collections.abc import Sequence

from tangram_celery.scheduling.residency import Chunk
from tangram_celery.scheduling.types import GpuPool, RunningJob

OVERRUN_S = 1e-6
"""When a running job past its expected finish is expected to end: any moment, not now."""


class Board:
    """The GPUs of one pool during planning: when each is free for good (after running and
    booked work), which are free now, and until when a free GPU stays idle (the start of the
    first booking on it: the hole a later job may fill)."""

    def __init__(self, pool: GpuPool, running: Sequence[RunningJob], now: float,
                 fallback: float) -> None:
        self.now = now
        free = set(pool.free)
        self.open = [gpu in free for gpu in range(pool.total)]
        self.avail = [now if gpu in free else now + fallback for gpu in range(pool.total)]
        """When each GPU is free for good; a GPU busy now is never free before `now`."""
        self.idle_until = [math.inf] * pool.total
        for job in running:
            finish = now + fallback if job.expected_finish is None else job.expected_finish
            for gpu in job.ids:
                if not self.open[gpu]:
                    self.avail[gpu] = max(finish, now + OVERRUN_S)
        self.open_count = len(free)

    def start_time(self, chunk: Chunk, length: float) -> float:
        """The earliest start of `length` seconds of work on `chunk`: now if every GPU of it is
        free now and stays idle that long, else when its last GPU is free for good."""
        now, opened, idle = self.now, self.open, self.idle_until
        end = now + length
        for gpu in chunk:
            if not opened[gpu] or idle[gpu] < end:
                break
        else:
            return now
        avail, latest = self.avail, now
        for gpu in chunk:
            if avail[gpu] > latest:
                latest = avail[gpu]
        return latest

    def book(self, chunk: Chunk, start: float, length: float) -> None:
        """Hold `chunk` from `start` for `length` seconds."""
        if start <= self.now:
            for gpu in chunk:
                self.open[gpu] = False
                self.avail[gpu] = max(self.avail[gpu], self.now + length)
            self.open_count -= len(chunk)
            return
        for gpu in chunk:
            self.idle_until[gpu] = min(self.idle_until[gpu], start)
            self.avail[gpu] = start + length

    def close(self, chunk: Chunk) -> None:
        """No later job may start now on `chunk` (the booking of an overdue job)."""
        for gpu in chunk:
            self.idle_until[gpu] = self.now


def aligned_chunks(total: int, units: int) -> list[Chunk]:
    """Every aligned chunk of `units` GPUs of a pool of `total` (never across a node when
    `units` is at most the node size, both powers of two)."""
    return [tuple(range(first, first + units)) for first in range(0, total, units)]
