"""The objective of greedy eviction: the ACT sum, in ticks, of one pool's admitted and still
waiting jobs, the waiting ones placed on a completion-time heap of the pool's units (step 4
of `ersa`)."""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from itertools import accumulate
from operator import attrgetter, itemgetter

import numpy as np

from tangram_celery.scheduling.dp import Allocation, Pick, round_ticks, ticks
from tangram_celery.scheduling.dp.allocation import MAX_TICKS, RESOLUTION
from tangram_celery.scheduling.ersa.config import SchedulerConfig
from tangram_celery.scheduling.ersa.queue import FIRST, JOB, OPTIONS, Entry
from tangram_celery.scheduling.topology import Operator
from tangram_celery.scheduling.types import RunningJob, Snapshot

Seed = tuple[int, int]
"""A heap entry of the estimate: (tick at which units are free, how many units)."""
Plain = tuple[int, int, int]
"""A waiting job for the estimate: units at its minimum, ticks there, ticks waited so far."""


class Group:
    """One pool's candidates and waiting jobs, prepared so each eviction step costs little.

    `objective(k, allocation)` is the objective, in ticks, with the first k elastic candidates
    admitted under `allocation`.
    """

    def __init__(
        self,
        snapshot: Snapshot,
        config: SchedulerConfig,
        operator: Operator,
        fixed: Sequence[Entry],
        elastic: Sequence[Entry],
        rest: Sequence[Entry],
    ) -> None:
        now = snapshot.now
        fallback = config.fallback_duration
        self.depth = config.depth
        self.fallback = ticks(fallback)
        self.elastic = tuple(elastic)
        self.rest = tuple(rest)
        running = _running_seeds(snapshot.running, operator.name, now, self.fallback)
        self.free = operator.free_units(operator.start)
        self.capacity = self.free + sum(units for _, units in running)
        units, costs, waited = _plain(fixed, now, fallback)
        self.fixed_total = sum(waited) + sum(costs)
        self.fixed_used = sum(units)
        self.static_seeds = running + list(zip(costs, units, strict=True))
        units, costs, waited = _plain(elastic, now, fallback)
        self.minimums = units
        """Each elastic candidate's minimum (and below, its ticks there and ticks waited)."""
        self.costs = costs
        self.waited = waited
        self.waited_prefix = [0, *accumulate(waited)]
        self.used_prefix = [0, *accumulate(units)]
        self.by_finish = np.argsort(np.array(costs, dtype=np.int64), kind="stable").tolist()
        self.need_suffix = [*accumulate(reversed(units), initial=0)][::-1]
        units, costs, waited = _plain(rest, now, fallback)
        self.rest_plain = list(zip(units, costs, waited, strict=True))
        self.rest_need = sum(units)

    def objective(self, k: int, allocation: Allocation) -> int:
        """The objective in ticks with the first k elastic candidates admitted."""
        total = self.fixed_total + self.waited_prefix[k] + allocation.total
        used = self.fixed_used + self.used_prefix[k]
        moved: list[Seed] = []
        for i, pick in allocation.picks.items():
            used += pick.units - self.minimums[i]
            moved.append((pick.cost, pick.units))
        waiting = [*zip(self.minimums[k:], self.costs[k:], self.waited[k:], strict=True),
                   *self.rest_plain]
        if not waiting:
            return total
        first = self.elastic[k] if k < len(self.elastic) else self.rest[0]
        tries = self.tries(first)
        seeds = self._seeds(k, allocation.picks, moved, used, tries[-1][0] - first.minimum)
        return total + _estimate(seeds, tries, waiting, self.capacity)

    def tries(self, first: Entry) -> list[tuple[int, int]]:
        """(units, ticks) the first waiting job may try: its first `depth` options if elastic."""
        count = min(self.depth, len(first.options)) if first.elastic else 1
        return [
            (units, self.fallback if d is None else ticks(d)) for units, d in first.options[:count]
        ]

    def _seeds(
        self, k: int, picks: Mapping[int, Pick], moved: list[Seed], used: int, more: int
    ) -> list[Seed]:
        """Heap seeds. Of the candidates admitted at their minimum only the earliest that the
        waiting jobs can reach are included: in all they take at most `need` units."""
        need = self.need_suffix[k] + self.rest_need + more
        seeds = self.static_seeds + moved
        if self.free > used:
            seeds.append((0, self.free - used))
        taken = 0
        minimums, costs = self.minimums, self.costs
        for i in self.by_finish:
            if taken >= need:
                break
            if i < k and i not in picks:
                units = minimums[i]
                seeds.append((costs[i], units))
                taken += units
        return seeds


def _plain(entries: Sequence[Entry], now: float, fallback: float
           ) -> tuple[list[int], list[int], list[int]]:
    """Units, ticks and ticks waited of each entry at its minimum, converted in one go.

    Same numbers as `dp.ticks` / `dp.round_ticks` one by one (IEEE division, then round
    half to even), which the naive reference uses.
    """
    if not entries:
        return [], [], []
    firsts = list(map(FIRST, map(OPTIONS, entries)))
    units = list(map(FIRST, firsts))
    durations = list(map(_SECOND, firsts))
    if None in durations:
        durations = [fallback if d is None else d for d in durations]
    first = np.array(durations, dtype=np.float64)
    submitted = np.fromiter(map(_SUBMITTED, map(JOB, entries)), np.float64, len(entries))
    costs = np.minimum(np.rint(first / RESOLUTION), MAX_TICKS).astype(np.int64).tolist()
    waited = np.rint((now - submitted) / RESOLUTION).astype(np.int64).tolist()
    return units, costs, waited


def _running_seeds(
    running: Sequence[RunningJob], key: str, now: float, fallback: int
) -> list[Seed]:
    seeds = []
    for job in running:
        if job.key == key and job.units > 0:
            left = (
                fallback if job.expected_finish is None else round_ticks(job.expected_finish - now)
            )
            seeds.append((max(left, 0), job.units))
    return seeds


def _estimate(
    seeds: list[Seed], tries: Sequence[tuple[int, int]], waiting: Sequence[Plain], capacity: int
) -> int:
    """Total ACT in ticks of the waiting jobs, under the best of the first one's tries."""
    heapq.heapify(seeds)  # each try starts from a copy of the same heap
    rest = waiting[1:]
    waited = waiting[0][2]
    return min(_simulate(seeds, [(units, cost, waited), *rest], capacity)
               for units, cost in tries)


def _simulate(seeds: list[Seed], waiting: Sequence[Plain], capacity: int) -> int:
    """Place the waiting jobs in order on a heap of (free tick, unit count) entries (`seeds`,
    a heap; not changed).

    A job needing u units starts when the u-th earliest unit is free and returns its u units
    when it finishes; requests are capped at the pool's unit count. Returns the ACT sum.
    """
    heap = list(seeds)
    replace, push = heapq.heapreplace, heapq.heappush
    total = 0
    for units, cost, waited in waiting:
        need = units if units < capacity else capacity
        if need <= 0:
            total += waited + cost
            continue
        start, count = heap[0]
        if count == need:
            replace(heap, (start + cost, need))
        elif count > need:
            replace(heap, (start, count - need))
            push(heap, (start + cost, need))
        else:
            start = _take_many(heap, need)
            push(heap, (start + cost, need))
        total += waited + start + cost
    return total


def _take_many(heap: list[Seed], need: int) -> int:
    """Pop entries until `need` units are taken; the tick at which the last one is free."""
    start = 0
    while need > 0:
        start, count = heapq.heappop(heap)
        if count > need:
            heapq.heappush(heap, (start, count - need))
        need -= count
    return start


_SECOND = itemgetter(1)
_SUBMITTED = attrgetter("submitted_at")
"""Fields read in bulk (`map` runs them in C)."""
