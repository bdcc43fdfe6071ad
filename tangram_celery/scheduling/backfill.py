"""EASY-style admission over a pool's unit count, with a reserve for short jobs (pure).

`plan` walks the queue in order and chooses, at their minimums, the jobs that start now:

* **FCFS until the head blocks.** A short job needs free units; a long (or elastic) job needs
  *long room*: free units that leave `reserve` units free or held by short jobs, i.e.
  ``total - long_held - max(short_held, reserve)``. The first job that does not fit is the
  head.
* **The head's shadow.** From the running jobs' expected finishes (and the jobs just chosen,
  at their minimums), the earliest time `shadow` at which the head would fit, and what is
  held at that time.
* **Backfilling.** A later *short* job may start ahead of the head when units are free and it
  cannot delay the head's start: it is expected to end by `shadow`, or the head still fits at
  `shadow` with it running (EASY's "extra units"; reserve units the head may not use count
  here). Long jobs never overtake the head.
* **Starvation bound.** A head that has waited `max_bypass_s` since it was submitted is
  *overdue*: nothing overtakes it and the reserve is waived for it. From then on it starts as
  soon as its minimum is free, so it starts at the latest `max_bypass_s` plus the longest
  run of any job started before that (however many short jobs keep arriving). Expected
  durations that turn out wrong can delay it only until it is overdue.

Counts only: pools whose fit depends on topology (GPU chunks) are not planned here.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter


@dataclass(frozen=True)
class Waiting:
    """A waiting job as the plan sees it: its unit counts with expected durations (one for an
    inelastic job, ascending), its class, and whether it is overdue (waited `max_bypass_s`)."""

    job_id: str
    options: tuple[tuple[int, float], ...]
    short: bool
    overdue: bool = False

    @property
    def units(self) -> int:
        """The smallest unit count."""
        return self.options[0][0]

    @property
    def duration(self) -> float:
        """The expected duration at the smallest unit count."""
        return self.options[0][1]

    def held_to(self, option: tuple[int, float]) -> Waiting:
        """The job held to one of its options."""
        return Waiting(self.job_id, (option,), self.short, self.overdue)


@dataclass(frozen=True)
class Busy:
    """Units held until an expected finish (absolute time), by a short job or not."""

    units: int
    finish: float
    short: bool


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


def plan(
    queue: Sequence[Waiting],
    busy: Sequence[Busy],
    total: int,
    free: int,
    reserve: int,
    now: float,
    backfill: bool = True,
) -> Plan:
    """Choose the jobs that start now (see the module docstring)."""
    held = Held(sum(b.units for b in busy if b.short), sum(b.units for b in busy if not b.short),
                free)
    chosen: list[Waiting] = []
    shadow: Shadow | None = None
    blocked = sum(not job.short for job in queue)
    for job in queue:
        blocked -= not job.short  # the non-short jobs queued behind this one
        if shadow is None:
            own = _reserve_for(job, reserve, total)
            room = held.room(own, total)
            pick = job if len(job.options) == 1 else _best_start(job, busy, chosen, room, total,
                                                                 own, now, blocked)
            if pick.units <= room:
                held.take(pick)
                chosen.append(pick)
                continue
            if not backfill or job.overdue:
                return _result(chosen, pick, held, reserve, total)
            shadow = shadow_of(pick, busy, chosen, total, own, now)
        elif job.short and job.units <= held.free and shadow.admits(job, now):
            held.take(job)
            chosen.append(job)
    return _result(chosen, shadow.head if shadow else None, held, reserve, total)


def _result(chosen: Sequence[Waiting], head: Waiting | None, held: Held, reserve: int,
            total: int) -> Plan:
    return Plan(tuple((job.job_id, job.units) for job in chosen),
                None if head is None else (head.job_id, head.units),
                max(held.room(reserve, total), 0))


def _best_start(job: Waiting, busy: Sequence[Busy], chosen: Sequence[Waiting], room: int,
                total: int, reserve: int, now: float, blocked: int = 0) -> Waiting:
    """Start now or wait for more units (the horizon view): the unit count with the earliest
    expected finish, starting when the room for it is expected to be free, where a wait costs
    once more for each of the `blocked` non-short jobs queued behind (they wait too). Starting
    now, the job is held only to its minimum: the paper's allocator spreads the room."""
    options = job.options
    fitting = options if options[-1][0] <= room else \
        options[:bisect_right(options, room, key=_UNITS)]
    best = min(fitting, key=_FASTEST) if fitting else None
    if best is not None and best[0] == options[-1][0]:
        return job.held_to(options[0])
    timeline = _timeline(busy, chosen, now)
    finish = math.inf if best is None else now + best[1]
    at = 0  # the room only grows along the timeline: each larger count fits no earlier
    for units, duration in options:
        if units <= room:
            continue
        while at < len(timeline) and \
                total - timeline[at][1] - max(timeline[at][2], reserve) < units:
            at += 1
        start = max(timeline[at][0], now) if at < len(timeline) else math.inf
        cost = start + duration + (start - now) * blocked
        if cost < finish:
            best, finish = (units, duration), cost
    assert best is not None, "an empty pool holds every job's counts"
    return job.held_to(options[0] if best[0] <= room else best)


_UNITS = itemgetter(0)
_FASTEST = itemgetter(1, 0)
"""An option's unit count; its (duration, units), the order `_best_start` prefers."""


Timeline = list[tuple[float, int, int]]
"""After each expected finish, in time order: (time, units held by others, by short jobs)."""


def _timeline(busy: Sequence[Busy], chosen: Sequence[Waiting], now: float) -> Timeline:
    events = [(b.finish, b.units, b.short) for b in busy]
    events += [(now + j.options[0][1], j.options[0][0], j.short) for j in chosen]
    short = sum(units for _, units, is_short in events if is_short)
    other = sum(units for _, units, is_short in events if not is_short)
    points = [(now, other, short)]
    for finish, units, is_short in sorted(events, key=_UNITS):
        if is_short:
            short -= units
        else:
            other -= units
        points.append((max(finish, now), other, short))
    return points


def _reserve_for(job: Waiting, reserve: int, total: int) -> int:
    """The reserve a job must leave: none for short or overdue jobs; never more than lets the
    job fit in an empty pool."""
    if job.short or job.overdue:
        return 0
    return max(min(reserve, total - job.units), 0)


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
