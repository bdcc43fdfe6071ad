"""A backend's own future events, in time order (ties in insertion order)."""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Timeline(Generic[T]):
    """A min-heap of (time, item) with stable ties."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, T]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, time: float, item: T) -> None:
        """Schedule ``item`` at ``time``."""
        self._seq += 1
        heapq.heappush(self._heap, (time, self._seq, item))

    def next_time(self) -> float:
        """The earliest scheduled time (inf when empty)."""
        return self._heap[0][0] if self._heap else math.inf

    def due(self, now: float) -> Iterator[T]:
        """Pop the items scheduled at or before ``now``, in order (including ones pushed
        at ``now`` while iterating)."""
        while self._heap and self._heap[0][0] <= now:
            yield heapq.heappop(self._heap)[2]
