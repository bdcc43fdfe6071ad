"""The timeline the admission plan looks ahead on: the expected finishes of the running and
the chosen jobs (`Horizon`), and a blocked head's shadow on it (`Shadow`, EASY's reservation)."""

from __future__ import annotations

from bisect import insort
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from tangram_celery.scheduling.backfill.waiting import UNITS, Waiting


@dataclass(frozen=True)
class Busy:
    """Units held until an expected finish (absolute time), by a short job or not."""

    units: int
    finish: float
    short: bool


@dataclass
class Shadow:
    """When the blocked head is expected to fit, and what is held then (EASY's reservation)."""

    head: Waiting
    time: float
    short: int
    other: int
    reserve: int
    total: int

    def admits(self, job: Waiting, now: float) -> bool:
        """Whether `job` may start now without delaying the head; if so, book it."""
        if now + job.duration <= self.time:
            return True
        if self.total - self.other - max(self.short + job.units, self.reserve) < self.head.units:
            return False
        self.short += job.units
        return True


Point = tuple[float, int, int]
"""A moment of the timeline: (time, units held by others, by short jobs)."""
Timeline = list[Point]
"""After each expected finish, in time order: (time, units held by others, by short jobs)."""


def _timeline(busy: Sequence[Busy], chosen: Sequence[Waiting], now: float) -> Timeline:
    events = [(b.finish, b.units, b.short) for b in busy]
    events += [(now + j.options[0][1], j.options[0][0], j.short) for j in chosen]
    short = sum(units for _, units, is_short in events if is_short)
    other = sum(units for _, units, is_short in events if not is_short)
    points = [(now, other, short)]
    for finish, units, is_short in sorted(events, key=UNITS):
        if is_short:
            short -= units
        else:
            other -= units
        points.append((max(finish, now), other, short))
    return points


class Horizon:
    """The timeline `_timeline` builds from the running jobs and the jobs chosen so far, kept
    up to date as `chosen` grows instead of rebuilt at every look: the expected finishes are
    sorted once, when first needed, and each job chosen later is inserted in place (by finish,
    then by position in running + chosen: the order of `_timeline`'s stable sort), and a look
    walks only as far as it needs. (With a NaN finish, whose sorted position depends on the
    sort, every look rebuilds the timeline.)"""

    def __init__(self, busy: Sequence[Busy], chosen: list[Waiting], now: float) -> None:
        self.busy = busy
        self.chosen = chosen
        self.now = now
        self.events: list[tuple[float, int, int, bool]] | None = None
        self.synced = 0
        self.plain = False

    def points(self, other: int, short: int) -> Iterator[Point]:
        """The timeline, lazily: now with the `other` and `short` units held (those of every
        running and chosen job), then after each expected finish."""
        events = self._sorted()
        if self.plain:
            yield from _timeline(self.busy, self.chosen, self.now)
            return
        now = self.now
        yield now, other, short
        for finish, _, units, is_short in events:
            if is_short:
                short -= units
            else:
                other -= units
            yield (now if now > finish else finish), other, short  # max(finish, now)

    def _sorted(self) -> list[tuple[float, int, int, bool]]:
        events, chosen, now, base = self.events, self.chosen, self.now, len(self.busy)
        if self.plain:
            return []
        if events is None:
            events = [(b.finish, i, b.units, b.short) for i, b in enumerate(self.busy)]
            self.events = events
            self.synced = 0
            self.plain = any(b.finish != b.finish for b in self.busy)
        added = [(now + j.options[0][1], base + i, j.options[0][0], j.short)
                 for i, j in enumerate(chosen[self.synced :], self.synced)]
        if any(event[0] != event[0] for event in added):
            self.plain = True
            return []
        if len(added) > 8 or self.synced == 0:
            events += added
            events.sort()
        else:
            for event in added:
                insort(events, event)
        self.synced = len(chosen)
        return events

    def shadow(self, head: Waiting, total: int, reserve: int, other: int, short: int) -> Shadow:
        """The head's shadow (`shadow_of`)."""
        for time, other_then, short_then in self.points(other, short):
            if total - other_then - max(short_then, reserve) >= head.units:
                return Shadow(head, time, short_then, other_then, reserve, total)
        raise AssertionError("an empty pool holds every job's counts")


def shadow_of(
    head: Waiting,
    busy: Sequence[Busy],
    chosen: Sequence[Waiting],
    total: int,
    reserve: int,
    now: float,
) -> Shadow:
    """The head's shadow: the earliest expected finish after which it fits, and what is held
    then."""
    for time, other, short in _timeline(busy, chosen, now):
        if total - other - max(short, reserve) >= head.units:
            return Shadow(head, time, short, other, reserve, total)
    raise AssertionError("an empty pool holds every job's counts")
