"""The admission plan: the jobs that start now at their minimums, the blocked head and the
long room left (`plan`, `choose`; see `backfill`)."""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

from tangram_celery.scheduling.backfill.horizon import Busy, Horizon, Point
from tangram_celery.scheduling.backfill.waiting import FASTEST, UNITS, Waiting


@dataclass(frozen=True)
class Plan:
    """Jobs that start now with the least units each gets (in queue order), the blocked head
    with the units it waits for, and the long room left after them (units elastic jobs among
    `chosen` may take beyond those; less than the head waits for)."""

    chosen: tuple[tuple[str, int], ...]
    head: tuple[str, int] | None
    long_left: int


@dataclass
class Held:
    """Units held now by short and by other jobs, and units free."""

    short: int
    other: int
    free: int

    def room(self, reserve: int, total: int) -> int:
        """Units a non-short job may take without eating into the reserve."""
        return min(self.free, total - self.other - max(self.short, reserve))

    def take(self, job: Waiting) -> None:
        """Account for `job` starting now."""
        self.free -= job.units
        if job.short:
            self.short += job.units
        else:
            self.other += job.units


def plan(
    queue: Sequence[Waiting],
    busy: Sequence[Busy],
    total: int,
    free: int,
    reserve: int,
    now: float,
    backfill: bool = True,
) -> Plan:
    """Choose the jobs that start now (see `backfill`)."""
    return choose(queue, busy, total, free, reserve, now, backfill).plan()


@dataclass(frozen=True)
class Choice:
    """What `plan` chose, by queue position: every job before position `at` (at their
    minimums, `chosen[:at]`), then the backfilled jobs at the positions `later`
    (`chosen[at:]`); the blocked head's pick at position `at` (None: no head, `at` is the
    queue's length); the long room left."""

    chosen: list[Waiting]
    at: int
    later: list[int]
    head: Waiting | None
    long_left: int

    def plan(self) -> Plan:
        """As a `Plan`."""
        chosen = self.chosen
        head = self.head
        return Plan(tuple(zip(map(_JOB_ID, chosen), map(_UNITS_OF, chosen), strict=True)),
                    None if head is None else (head.job_id, head.units), self.long_left)


def choose(
    queue: Sequence[Waiting],
    busy: Sequence[Busy],
    total: int,
    free: int,
    reserve: int,
    now: float,
    backfill: bool = True,
) -> Choice:
    """`plan`, by queue position (see `Choice`)."""
    short = sum(b.units for b in busy if b.short)
    other = sum(b.units for b in busy if not b.short)
    chosen: list[Waiting] = []
    horizon = Horizon(busy, chosen, now)
    blocked = sum(not job.short for job in queue)
    at = 0
    for job in queue:
        is_short, overdue, units, easy, pick = job.record
        if not is_short:
            blocked -= 1  # the non-short jobs queued behind this one
        if is_short or overdue:  # `_reserve_for`
            own = 0
        else:
            own = total - units
            own = reserve if reserve <= own else own
            own = own if own >= 0 else 0
        room = total - other - (short if short >= own else own)  # `Held.room`
        room = free if free <= room else room
        if easy > room:  # else `_best_start` would not look ahead: the job at its minimum
            pick = _best_start(job, horizon, room, total, own, now, blocked, other, short)
            units = pick.units
        if units <= room:
            free -= units
            if is_short:
                short += units
            else:
                other += units
            chosen.append(pick)
            at += 1
            continue
        if not backfill or overdue:
            return Choice(chosen, at, [], pick, _long_left(short, other, free, reserve, total))
        shadow = horizon.shadow(pick, total, own, other, short)
        later = []
        for position in range(at + 1, len(queue)):
            job = queue[position]
            if job.short and job.units <= free and shadow.admits(job, now):
                free -= job.units
                short += job.units
                chosen.append(job)
                later.append(position)
        return Choice(chosen, at, later, pick, _long_left(short, other, free, reserve, total))
    return Choice(chosen, at, [], None, _long_left(short, other, free, reserve, total))


def _long_left(short: int, other: int, free: int, reserve: int, total: int) -> int:
    """The room left for long jobs, at least 0 (`Held.room` with the reserve)."""
    return max(Held(short, other, free).room(reserve, total), 0)


_JOB_ID = attrgetter("job_id")
_UNITS_OF = attrgetter("units")


def _best_start(job: Waiting, horizon: Horizon, room: int, total: int, reserve: int,
                now: float, blocked: int, other: int, short: int) -> Waiting:
    """Start now or wait for more units (the horizon view): the unit count with the earliest
    expected finish, starting when the room for it is expected to be free, where a wait costs
    once more for each of the `blocked` non-short jobs queued behind (they wait too). Starting
    now, the job is held only to its minimum: the paper's allocator spreads the room.
    `other`, `short`: the units held now by non-short and short jobs (running or chosen)."""
    options = job.options
    fits = len(options) if options[-1][0] <= room else bisect_right(options, room, key=UNITS)
    if fits == len(options):  # every count fits now: no wait can finish sooner
        return job.minimal
    best = min(options[:fits], key=FASTEST) if fits else None
    points = horizon.points(other, short)
    point: Point | None = next(points)
    finish = math.inf if best is None else now + best[1]
    for units, duration in options[fits:]:  # the room only grows along the timeline: each
        while point is not None and \
                total - point[1] - max(point[2], reserve) < units:  # larger count fits no earlier
            point = next(points, None)
        start = max(point[0], now) if point is not None else math.inf
        cost = start + duration + (start - now) * blocked
        if cost < finish:
            best, finish = (units, duration), cost
    assert best is not None, "an empty pool holds every job's counts"
    return job.minimal if best[0] <= room else job.held_to(best)


def _reserve_for(job: Waiting, reserve: int, total: int) -> int:
    """The reserve a job must leave: none for short or overdue jobs; never more than lets the
    job fit in an empty pool."""
    if job.short or job.overdue:
        return 0
    return max(min(reserve, total - job.units), 0)
