"""Elastic resource scheduling (the ARL-Tangram algorithm): `decide(snapshot) -> Decision`.

At one scheduling point:

1. Order the waiting jobs (`SchedulerConfig.ordering`, FCFS by default).
2. Candidates: the longest prefix of that order that fits with every job at its minimum, placed
   one by one on its pool's topology (so GPU chunk fragmentation counts, not only totals).
   Jobs that no pool could ever serve are reported as unplaceable and skipped.
3. Per pool, candidates that are not elastic (unknown or single-option) start at their minimum.
4. The elastic candidates of a pool are settled by greedy eviction: admit all of them, then keep
   evicting the last one while the objective strictly falls (the first candidate always stays).
   The objective of admitting the first K is the sum of ACTs (time waited so far + expected
   duration) of every job of the pool that is admitted or still waiting:
   * admitted elastic candidates get the DP's optimal discrete allocation of the units left by
     the inelastic ones (least total duration; ties: see `dp`);
   * every still-waiting job (evicted candidates, then the rest of the queue) is placed in order,
     at its minimum, on a completion-time heap of the pool's units, seeded with running jobs'
     and admitted jobs' expected finishes (units left free are free now); its start is the
     time the units it needs are free. The first waiting job may take any of its first `depth`
     allowed unit counts; the estimate keeps the best.

Unknown durations are replaced by `fallback_duration` in the estimate. The heap counts units
(no topology) and caps a request at the pool's unit count. Objectives are computed in integer
ticks (`dp.RESOLUTION`, relative to `now`), so they are exact and do not depend on summation
order; the admitted part is the DP's total plus the candidates' waited time, O(1) per step.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, repeat
from operator import attrgetter, is_, itemgetter
from typing import NamedTuple, cast

import numpy as np

from tangram_celery.scheduling.dp import (
    INFEASIBLE,
    MAX_TICKS,
    RESOLUTION,
    Allocation,
    CountSolver,
    IntArray,
    OptionArrays,
    Pick,
    PrefixSolver,
    State,
    round_ticks,
    ticks,
)
from tangram_celery.scheduling.ordering import Fcfs, Ordering
from tangram_celery.scheduling.topology import CpuOperator, Operator, operator_for
from tangram_celery.scheduling.types import (
    Decision,
    GroupOutcome,
    Job,
    Option,
    RunningJob,
    Snapshot,
    Start,
    option_arrays,
    prime_option_arrays,
    prime_option_ticks,
)


@dataclass(frozen=True)
class SchedulerConfig:
    """Settings of `decide`.

    `depth`: how many of its smallest allowed unit counts the first waiting job may try in the
    estimate (>= 1; the design's "1..depth units" for contiguous sets starting at 1).
    `fallback_duration`: expected duration assumed wherever one is unknown.
    `ordering`: the queue ordering policy.
    """

    depth: int = 2
    fallback_duration: float = 1.0
    ordering: Ordering = field(default_factory=Fcfs)

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise ValueError("depth must be at least 1")
        if not self.fallback_duration > 0:
            raise ValueError("fallback_duration must be positive")


class Entry(NamedTuple):
    """A placeable job with the options its pool can serve; `elastic` as `decide` treats it;
    `lead`: how many options it holds if they are the first ones of its job's, else 0 (then
    the DP reads its rows from the job's cached arrays)."""

    job: Job
    options: tuple[Option, ...]
    elastic: bool
    lead: int = 0

    @property
    def minimum(self) -> int:
        """The smallest usable unit count."""
        return self.options[0][0]


@dataclass(frozen=True)
class Queue:
    """The ordered placeable jobs, how many of them are candidates, and the unplaceable ids."""

    entries: tuple[Entry, ...]
    candidates: int
    unplaceable: tuple[str, ...]


Band = tuple[int, int]
"""The least and the most units an elastic job may be given."""


def decide(snapshot: Snapshot, config: SchedulerConfig | None = None) -> Decision:
    """Decide which waiting jobs start now and on which units (see the module docstring)."""
    config = config or SchedulerConfig()
    return settle(snapshot, config.ordering.order(snapshot.waiting, snapshot.now), config)


def settle(
    snapshot: Snapshot,
    ordered: Sequence[Job],
    config: SchedulerConfig,
    bands: Mapping[str, Band] | None = None,
) -> Decision:
    """`decide` on a queue already in the order to consider (`config.ordering` is not applied).

    `bands` limits the unit counts elastic jobs may get (job id -> (least, most) units; a band
    that keeps none of a job's counts keeps its minimum), so other policies can steer the
    allocator without copying it. Without bands this is exactly `decide`.
    """
    operators = {pool.name: operator_for(pool) for pool in snapshot.pools}
    return settle_queue(snapshot, config, build_queue(ordered, operators, bands), operators)


def settle_queue(
    snapshot: Snapshot, config: SchedulerConfig, queue: Queue, operators: Mapping[str, Operator]
) -> Decision:
    """`settle` on a queue already built (`build_queue`, or one a caller built the same way)
    for the pools of `operators`; of `snapshot` only the clock and the running jobs count."""
    assigned: dict[str, tuple[int, ...]] = {}
    options: dict[str, int] = {}
    deferred: list[str] = []
    groups: list[GroupOutcome] = []
    alone = len(operators) == 1
    for operator in operators.values():
        outcome = _settle_pool(snapshot, config, queue, operator, assigned, options, alone)
        if outcome is not None:
            groups.append(outcome)
            deferred.extend(outcome.candidates[outcome.admitted :])
    starts = []
    for entry in queue.entries[: queue.candidates]:
        job = entry.job
        units = assigned.get(job.job_id)
        if units is not None:
            duration = entry.options[options.get(job.job_id, 0)][1]
            starts.append(_start(job.job_id, job.key, units, duration))
    return Decision(tuple(starts), tuple(deferred), queue.unplaceable, tuple(groups))


def _start(job_id: str, key: str, units: tuple[int, ...], duration: float | None,
           new: Callable[[type[Start]], Start] = object.__new__) -> Start:
    """`Start(job_id, key, units, duration)`, built a third as fast: a frozen dataclass sets
    each field through `object.__setattr__`; `Start` checks nothing, so its fields are stored
    directly (the same object: equal, same repr, pickles alike)."""
    start = new(Start)
    fields = start.__dict__
    fields["job_id"] = job_id
    fields["key"] = key
    fields["units"] = units
    fields["expected_duration"] = duration
    return start


def build_queue(
    ordered: Sequence[Job],
    operators: Mapping[str, Operator],
    bands: Mapping[str, Band] | None = None,
) -> Queue:
    """Drop unplaceable jobs, hold elastic jobs to their bands, find the longest prefix that
    fits at minimums."""
    entries: list[Entry] = []
    unplaceable: list[str] = []
    usable = {name: operator.usable for name, operator in operators.items()}
    bands = bands or {}
    for job in ordered:
        serve = usable.get(job.key)
        entry = None if serve is None else queue_entry(job, serve, bands.get(job.job_id)
                                                        if bands else None)
        if entry is None:
            unplaceable.append(job.job_id)
        else:
            entries.append(entry)
    return Queue(tuple(entries), _fitting(entries, operators), tuple(unplaceable))


def queue_entry(
    job: Job, usable: Callable[[tuple[Option, ...]], tuple[Option, ...]], band: Band | None
) -> Entry | None:
    """A job's queue entry: the options its pool can serve (`usable`), held to `band` if the
    job is elastic; None if the pool can serve none. It depends on the job, the pool's
    `usable` and the band alone (callers may cache it)."""
    options = usable(job.options)
    if not options:
        return None
    if band is not None and job.elastic:
        options = _within(options, band)
    full = job.options
    if options is full:
        return Entry(job, options, job.is_elastic, len(full))
    known = job.known or None not in [d for _, d in options]  # all known: any of them too
    elastic = job.elastic and known and len(options) > 1
    lead = options[0] is full[0] and options[-1] is full[len(options) - 1]
    return Entry(job, options, elastic, len(options) if lead else 0)


def _within(options: tuple[Option, ...], band: Band) -> tuple[Option, ...]:
    """The options whose unit counts lie in the band (a slice), else the minimum."""
    low = bisect_left(options, band[0], key=itemgetter(0))
    high = bisect_right(options, band[1], key=itemgetter(0))
    if low == 0 and high == len(options):
        return options
    return options[low:high] if low < high else options[:1]


def _fitting(entries: Sequence[Entry], operators: Mapping[str, Operator]) -> int:
    """Length of the longest prefix of `entries` that fits at minimums."""
    if all(isinstance(operator, CpuOperator) for operator in operators.values()):
        left = {name: operator.free_units(operator.start) for name, operator in operators.items()}
        for count, (job, options, *_) in enumerate(entries):  # a core count: subtraction
            need = options[0][0]
            if need > left[job.key]:
                return count
            left[job.key] -= need
        return len(entries)
    states = {name: operator.start for name, operator in operators.items()}
    places = {name: operator.place for name, operator in operators.items()}
    for count, (job, options, *_) in enumerate(entries):
        placed = places[job.key](states[job.key], options[0][0])
        if placed is None:
            return count
        states[job.key] = placed
    return len(entries)


def _settle_pool(
    snapshot: Snapshot,
    config: SchedulerConfig,
    queue: Queue,
    operator: Operator,
    assigned: dict[str, tuple[int, ...]],
    options: dict[str, int],
    alone: bool = False,
) -> GroupOutcome | None:
    """Settle one pool's candidates: add the units of those that start to `assigned`, and
    the option index of those that start above their minimum to `options`; the eviction
    outcome if elastic. `alone`: the queue holds this pool's jobs only."""
    name = operator.name
    candidates = queue.entries[: queue.candidates]
    mine = candidates if alone else [e for e in candidates if e.job.key == name]
    fixed: list[Entry] = []
    elastic: list[Entry] = []
    for entry in mine:
        (elastic if entry.elastic else fixed).append(entry)
    admitted = 0
    picks: Mapping[int, Pick] = {}
    outcome = None
    if elastic:
        rest = queue.entries[queue.candidates :]
        if not alone:
            rest = tuple(e for e in rest if e.job.key == name)
        group = Group(snapshot, config, operator, fixed, elastic, rest)
        solver = _solver(operator, _after(operator, fixed), elastic, group.minimums)
        admitted, allocation, objectives = _evict(group, solver)
        picks = allocation.picks
        ids = tuple(map(_JOB_ID, map(_JOB, elastic)))
        values = tuple(value * RESOLUTION for value in objectives)
        outcome = GroupOutcome(name, ids, admitted, values)
    chosen = [*fixed, *elastic[:admitted]]
    if chosen:
        started = list(map(_JOB_ID, map(_JOB, chosen)))
        least = map(_FIRST, map(_FIRST, map(_OPTIONS, chosen)))
        requests = list(zip(started, least, strict=True))
        at = len(fixed)
        for i, pick in picks.items():
            requests[at + i] = (started[at + i], elastic[i].options[pick.option][0])
            options[started[at + i]] = pick.option
        assigned.update(operator.assign(requests))
    return outcome


def _solver(operator: Operator, state: State, elastic: Sequence[Entry],
            minimums: Sequence[int]) -> PrefixSolver:
    """The prefix DP over the elastic candidates' options (at least `minimums` units each),
    from the jobs' cached arrays."""
    if isinstance(operator, CpuOperator):
        solver = _count_solver(state[0], elastic, minimums)
        if solver is not None:
            return solver
    offsets = [_offset(e) for e in elastic]
    prime_option_arrays([e.job for e, at in zip(elastic, offsets, strict=True) if at is not None])
    rows = [_arrays(e, at) for e, at in zip(elastic, offsets, strict=True)]
    return operator.solver(state, rows)


def _count_solver(budget: int, elastic: Sequence[Entry],
                  minimums: Sequence[int]) -> CountSolver | None:
    """A `CountSolver` whose rows are read from the jobs' cached tick costs, when every entry
    holds the first options of its job's (`Entry.lead`; None otherwise)."""
    lengths = list(map(_LEAD, elastic))
    shortest, width = min(lengths), max(lengths)
    if shortest == 0:
        return None
    jobs = list(map(_JOB, elastic))
    cached = list(map(dict.get, map(_FIELDS, jobs), repeat("option_ticks")))  # or None
    if any(map(is_, cached, repeat(None))):
        prime_option_ticks(jobs)
        cached = list(map(_TICKS, jobs))
    rows = cast(list[IntArray], cached)
    sizes = list(map(len, rows))
    flat = np.concatenate(rows)  # a new array: the rows may be written below
    if min(sizes) == max(sizes):
        costs = flat.reshape(len(jobs), sizes[0])[:, :width]
    else:
        costs = np.full((len(jobs), max(sizes)), INFEASIBLE, dtype=np.int64)
        costs[np.arange(max(sizes))[None, :] < np.array(sizes)[:, None]] = flat
        costs = costs[:, :width]
    present = None
    if shortest < width:
        present = np.arange(width)[None, :] < np.array(lengths, dtype=np.intp)[:, None]
        costs[~present] = INFEASIBLE
    least = np.array(minimums, dtype=np.intp)
    if all(map(_RUNS, jobs)):
        return CountSolver.padded(budget, least, None, costs, present)
    if present is None:
        present = np.ones(costs.shape, dtype=np.bool_)
    units = np.zeros((len(jobs), width), dtype=np.intp)
    units[present] = np.concatenate([job.option_arrays[0][:n] for job, n in
                                     zip(jobs, lengths, strict=True)])
    extras = units - least[:, None]
    contiguous = bool(np.all((extras == np.arange(width)) | ~present))
    return CountSolver.padded(budget, least, None if contiguous else extras, costs, present)


_JOB = itemgetter(0)
_JOB_ID = attrgetter("job_id")
_OPTIONS = itemgetter(1)
_LEAD = itemgetter(3)
_FIRST = itemgetter(0)
_SECOND = itemgetter(1)
_TICKS = attrgetter("option_ticks")
_FIELDS = attrgetter("__dict__")
_RUNS = attrgetter("runs")
_SUBMITTED = attrgetter("submitted_at")
"""Fields read in bulk (`map` runs them in C)."""


def _offset(entry: Entry) -> int | None:
    """Where the entry's options start among its job's, if they are a contiguous run of them
    (ascending counts: a subset whose ends are the job's options n - 1 apart is that run)."""
    options, full = entry.options, entry.job.options
    if options is full:
        return 0
    first = options[0]
    start = 0 if full[0] is first else next(
        (i for i, option in enumerate(full) if option is first), None)
    if start is None or options[-1] is not full[start + len(options) - 1]:
        return None
    return start


def _arrays(entry: Entry, start: int | None) -> OptionArrays:
    """The entry's options as arrays: views into the job's cached arrays when they are a run
    of them starting at `start` (None: not a run)."""
    if start is None:
        return option_arrays(entry.options)
    units, durations = entry.job.option_arrays
    end = start + len(entry.options)
    if start == 0 and end == len(units):
        return units, durations
    return units[start:end], durations[start:end]


def _after(operator: Operator, fixed: Sequence[Entry]) -> State:
    state = operator.start
    for entry in fixed:
        placed = operator.place(state, entry.minimum)
        if placed is None:
            raise AssertionError("inelastic candidates no longer fit; placement is order-bound")
        state = placed
    return state


def _evict(group: Group, solver: PrefixSolver) -> tuple[int, Allocation, list[int]]:
    admitted = len(group.elastic)
    allocation = solver.solve(admitted)
    best = group.objective(admitted, allocation)
    objectives = [best]
    while admitted > 1:
        shorter = solver.solve(admitted - 1)
        value = group.objective(admitted - 1, shorter)
        objectives.append(value)
        if not value < best:
            break
        admitted, allocation, best = admitted - 1, shorter, value
    return admitted, allocation, objectives


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
    firsts = list(map(_FIRST, map(_OPTIONS, entries)))
    units = list(map(_FIRST, firsts))
    durations = list(map(_SECOND, firsts))
    if None in durations:
        durations = [fallback if d is None else d for d in durations]
    first = np.array(durations, dtype=np.float64)
    submitted = np.fromiter(map(_SUBMITTED, map(_JOB, entries)), np.float64, len(entries))
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
