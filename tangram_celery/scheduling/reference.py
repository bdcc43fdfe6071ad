"""A naive reference of `ersa.decide`, written straight from the definition; for tests and bench.

Shared by the tests (which plug in an allocator that enumerates every allocation) and by
`tangram_bench.scheduler` (which measures the speed-up of `decide` over it). It shares
only the plain types, the ordering policies and the topology operators' `place` / `assign`
with `decide`; the allocation, the waiting estimate and the eviction loop are its own:

* every eviction step is recomputed from scratch: a plain-Python DP over (candidate, exact
  pool state) with dictionaries, as the paper states it, with a set-based back-track for the
  tie rule (least total duration in `dp.ticks`, then the smallest unit count for the last
  candidate, then for the one before, ...);
* the waiting estimate keeps one heap entry per unit, as the design describes it, and sums
  ACTs in ticks measured from `now` (the same `dp.ticks` / `dp.round_ticks` conversions).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from tangram_celery.scheduling.dp import State, round_ticks, ticks
from tangram_celery.scheduling.dp.allocation import RESOLUTION
from tangram_celery.scheduling.ersa import SchedulerConfig
from tangram_celery.scheduling.topology import Operator, operator_for, usable_options
from tangram_celery.scheduling.types import Decision, GroupOutcome, Job, Option, Snapshot, Start

Rows = Sequence[Sequence[tuple[int, float]]]
"""Per candidate, its allowed (unit count, expected duration) pairs in ascending unit order."""
Allocator = Callable[[Operator, State, Rows], tuple[int, ...]]
"""Given a pool operator, its state and the candidates' options: the chosen option indices."""


def python_dp(operator: Operator, start: State, rows: Rows) -> tuple[int, ...]:
    """The optimal allocation by a plain-Python DP over exact pool states."""
    costs = [[(units, ticks(duration)) for units, duration in row] for row in rows]
    levels: list[dict[State, int]] = [{start: 0}]
    for row in costs:
        following: dict[State, int] = {}
        for state, value in levels[-1].items():
            for units, cost in row:
                placed = operator.place(state, units)
                if placed is not None:
                    total = value + cost
                    if placed not in following or total < following[placed]:
                        following[placed] = total
        levels.append(following)
    best = min(levels[-1].values())
    live = {state for state, value in levels[-1].items() if value == best}
    picks: list[int] = []
    for k in range(len(rows), 0, -1):
        pick, live = _step_back(operator, costs[k - 1], levels[k - 1], levels[k], live)
        picks.append(pick)
    picks.reverse()
    return tuple(picks)


def _step_back(
    operator: Operator,
    row: Sequence[tuple[int, int]],
    before: dict[State, int],
    after: dict[State, int],
    live: set[State],
) -> tuple[int, set[State]]:
    pick = len(row)
    sources: set[State] = set()
    for state, value in before.items():
        for index, (units, cost) in enumerate(row):
            placed = operator.place(state, units)
            if placed in live and value + cost == after[placed]:
                if index < pick:
                    pick, sources = index, {state}
                elif index == pick:
                    sources.add(state)
    return pick, sources


def decide_reference(
    snapshot: Snapshot,
    config: SchedulerConfig | None = None,
    allocate: Allocator = python_dp,
) -> Decision:
    """What `ersa.decide` must return, computed the slow, obvious way."""
    config = config or SchedulerConfig()
    operators = {pool.name: operator_for(pool) for pool in snapshot.pools}
    queue: list[tuple[Job, tuple[Option, ...]]] = []
    unplaceable: list[str] = []
    for job in config.ordering.order(snapshot.waiting, snapshot.now):
        options = usable_options(job, operators[job.key]) if job.key in operators else ()
        if options:
            queue.append((job, options))
        else:
            unplaceable.append(job.job_id)
    prefix = _prefix_length(queue, operators)
    units: dict[str, tuple[int, ...]] = {}
    deferred: list[str] = []
    groups: list[GroupOutcome] = []
    for name, operator in operators.items():
        candidates = [item for item in queue[:prefix] if item[0].key == name]
        rest = [item for item in queue[prefix:] if item[0].key == name]
        group = _settle(snapshot, config, operator, candidates, rest, allocate, units)
        if group is not None:
            groups.append(group)
            deferred.extend(group.candidates[group.admitted :])
    starts = []
    for job, options in queue[:prefix]:
        if job.job_id in units:
            count = len(units[job.job_id])
            duration = next((d for u, d in options if u == count), None)
            starts.append(Start(job.job_id, job.key, units[job.job_id], duration))
    return Decision(tuple(starts), tuple(deferred), tuple(unplaceable), tuple(groups))


def _is_elastic(job: Job, options: tuple[Option, ...]) -> bool:
    return job.elastic and len(options) > 1 and None not in [d for _, d in options]


def _prefix_length(
    queue: Sequence[tuple[Job, tuple[Option, ...]]], operators: dict[str, Operator]
) -> int:
    states = {name: operator.start for name, operator in operators.items()}
    for length, (job, options) in enumerate(queue):
        placed = operators[job.key].place(states[job.key], options[0][0])
        if placed is None:
            return length
        states[job.key] = placed
    return len(queue)


def _settle(
    snapshot: Snapshot,
    config: SchedulerConfig,
    operator: Operator,
    candidates: list[tuple[Job, tuple[Option, ...]]],
    rest: list[tuple[Job, tuple[Option, ...]]],
    allocate: Allocator,
    units: dict[str, tuple[int, ...]],
) -> GroupOutcome | None:
    fixed = [(job, options, 0) for job, options in candidates if not _is_elastic(job, options)]
    elastic = [(job, options) for job, options in candidates if _is_elastic(job, options)]
    state = operator.start
    for _, options, _ in fixed:
        placed = operator.place(state, options[0][0])
        assert placed is not None
        state = placed
    if not elastic:
        if fixed:
            units.update(operator.assign([(job.job_id, opts[0][0]) for job, opts, _ in fixed]))
        return None
    rows = [tuple((u, float(d)) for u, d in options if d is not None) for _, options in elastic]
    kept, chosen, objectives = _evict(
        snapshot, config, operator, fixed, elastic, rest, rows, state, allocate
    )
    requests = [(job.job_id, opts[0][0]) for job, opts, _ in fixed]
    requests += [(job.job_id, opts[i][0]) for (job, opts), i in zip(elastic, chosen, strict=False)]
    units.update(operator.assign(requests))
    ids = tuple(job.job_id for job, _ in elastic)
    values = tuple(value * RESOLUTION for value in objectives)
    return GroupOutcome(operator.name, ids, kept, values)


def _evict(
    snapshot: Snapshot,
    config: SchedulerConfig,
    operator: Operator,
    fixed: list[tuple[Job, tuple[Option, ...], int]],
    elastic: list[tuple[Job, tuple[Option, ...]]],
    rest: list[tuple[Job, tuple[Option, ...]]],
    rows: Rows,
    state: State,
    allocate: Allocator,
) -> tuple[int, tuple[int, ...], list[int]]:
    """Greedy eviction, every step from scratch: (kept, its allocation, objective per step)."""
    objectives: list[int] = []
    choices: list[tuple[int, ...]] = []
    kept = len(elastic)
    while True:
        choice = allocate(operator, state, rows[:kept])
        admitted = fixed + [(j, o, i) for (j, o), i in zip(elastic, choice, strict=False)]
        waiting = elastic[kept:] + rest
        objectives.append(_objective(snapshot, config, operator, admitted, waiting))
        choices.append(choice)
        if len(objectives) > 1 and not objectives[-1] < objectives[-2]:
            return kept + 1, choices[-2], objectives
        if kept == 1:
            return kept, choice, objectives
        kept -= 1


def _duration(options: tuple[Option, ...], index: int, fallback: float) -> float:
    duration = options[index][1]
    return fallback if duration is None else duration


def _objective(
    snapshot: Snapshot,
    config: SchedulerConfig,
    operator: Operator,
    admitted: Sequence[tuple[Job, tuple[Option, ...], int]],
    waiting: Sequence[tuple[Job, tuple[Option, ...]]],
) -> int:
    """Sum of ACTs in ticks, times measured from `now`; one heap entry per unit."""
    now, fallback = snapshot.now, config.fallback_duration
    unit_free_at: list[int] = []
    for running in snapshot.running:
        if running.key == operator.name:
            finish = running.expected_finish
            left = ticks(fallback) if finish is None else max(round_ticks(finish - now), 0)
            unit_free_at += [left] * running.units
    total = 0
    used = 0
    for job, options, index in admitted:
        cost = ticks(_duration(options, index, fallback))
        total += round_ticks(now - job.submitted_at) + cost
        unit_free_at += [cost] * options[index][0]
        used += options[index][0]
    unit_free_at += [0] * (operator.free_units(operator.start) - used)
    if waiting:
        job, options = waiting[0]
        tries = min(config.depth, len(options)) if _is_elastic(job, options) else 1
        estimates = [_estimate(unit_free_at, waiting, i, now, fallback) for i in range(tries)]
        total += min(estimates)
    return total


def _estimate(
    unit_free_at: list[int],
    waiting: Sequence[tuple[Job, tuple[Option, ...]]],
    first: int,
    now: float,
    fallback: float,
) -> int:
    heap = list(unit_free_at)
    heapq.heapify(heap)
    total = 0
    for position, (job, options) in enumerate(waiting):
        index = first if position == 0 else 0
        cost = ticks(_duration(options, index, fallback))
        need = min(options[index][0], len(heap))
        popped = [heapq.heappop(heap) for _ in range(need)]
        start = max(popped, default=0)
        total += round_ticks(now - job.submitted_at) + start + cost
        for _ in range(need):
            heapq.heappush(heap, start + cost)
    return total
