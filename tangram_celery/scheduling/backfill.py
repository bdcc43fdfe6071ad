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
from bisect import bisect_right, insort
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter

from tangram_celery.scheduling.types import derived


@dataclass(frozen=True)
class Waiting:
    """A waiting job as the plan sees it: its unit counts with expected durations (one for an
    inelastic job, ascending), its class, and whether it is overdue (waited `max_bypass_s`).

    What the plan derives from it alone is cached on it (callers may keep a job's view across
    scheduling points)."""

    job_id: str
    options: tuple[tuple[int, float], ...]
    short: bool
    overdue: bool = False

    @derived
    def units(self) -> int:
        """The smallest unit count."""
        return self.options[0][0]

    @derived
    def duration(self) -> float:
        """The expected duration at the smallest unit count."""
        return self.options[0][1]

    def held_to(self, option: tuple[int, float]) -> Waiting:
        """The job held to one of its options."""
        return new_waiting(self.job_id, (option,), self.short, self.overdue)

    @derived
    def minimal(self) -> Waiting:
        """The job held to its smallest count (itself if it has one count)."""
        return self if len(self.options) == 1 else self.held_to(self.options[0])

    @derived
    def fastest_at_most(self) -> bool:
        """Whether its largest count is also its fastest (the one `_best_start` prefers when
        every count fits: least duration, then fewest units); a one-count job counts."""
        return min(self.options, key=_FASTEST)[0] == self.options[-1][0]

    @derived
    def record(self) -> tuple[bool, bool, int, int, Waiting]:
        """What `choose` reads for each job: short, overdue, its minimum, the room from which
        on it starts at its minimum without looking ahead (none for one count; for more, its
        largest count if that is also its fastest, else never), and the job held to its
        minimum (`minimal`)."""
        if len(self.options) == 1:
            easy = -_NEVER
        elif self.fastest_at_most:
            easy = self.options[-1][0]
        else:
            easy = _NEVER
        return self.short, self.overdue, self.units, easy, self.minimal


_NEVER = 1 << 62
"""A room no pool reaches."""


def new_waiting(job_id: str, options: tuple[tuple[int, float], ...], short: bool,
                overdue: bool = False,
                new: Callable[[type[Waiting]], Waiting] = object.__new__) -> Waiting:
    """`Waiting(job_id, options, short, overdue)`, built a third as fast: a frozen dataclass
    sets each field through `object.__setattr__`; `Waiting` checks nothing, so its fields are
    stored directly (the same object: equal, same repr)."""
    view = new(Waiting)
    fields = view.__dict__
    fields["job_id"] = job_id
    fields["options"] = options
    fields["short"] = short
    fields["overdue"] = overdue
    return view


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
    fits = len(options) if options[-1][0] <= room else bisect_right(options, room, key=_UNITS)
    if fits == len(options):  # every count fits now: no wait can finish sooner
        return job.minimal
    best = min(options[:fits], key=_FASTEST) if fits else None
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


_UNITS = itemgetter(0)
_FASTEST = itemgetter(1, 0)
"""An option's unit count; its (duration, units), the order `_best_start` prefers."""


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
    for finish, units, is_short in sorted(events, key=_UNITS):
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
