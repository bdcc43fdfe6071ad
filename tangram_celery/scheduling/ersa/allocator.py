"""The paper's allocator: `decide` and `settle` settle each pool's candidates by greedy
eviction and turn what is admitted into starts (see `ersa`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter

from tangram_celery.scheduling.dp import Allocation, Pick, PrefixSolver, State
from tangram_celery.scheduling.dp.allocation import RESOLUTION
from tangram_celery.scheduling.ersa.config import SchedulerConfig
from tangram_celery.scheduling.ersa.objective import Group
from tangram_celery.scheduling.ersa.queue import (
    FIRST,
    JOB,
    OPTIONS,
    Band,
    Entry,
    Queue,
    build_queue,
)
from tangram_celery.scheduling.ersa.rows import prefix_solver
from tangram_celery.scheduling.topology import Operator, operator_for
from tangram_celery.scheduling.types import Decision, GroupOutcome, Job, Snapshot, Start


def decide(snapshot: Snapshot, config: SchedulerConfig | None = None) -> Decision:
    """Decide which waiting jobs start now and on which units (see `ersa`)."""
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
        solver = prefix_solver(operator, _after(operator, fixed), elastic, group.minimums)
        admitted, allocation, objectives = _evict(group, solver)
        picks = allocation.picks
        ids = tuple(map(_JOB_ID, map(JOB, elastic)))
        values = tuple(value * RESOLUTION for value in objectives)
        outcome = GroupOutcome(name, ids, admitted, values)
    chosen = [*fixed, *elastic[:admitted]]
    if chosen:
        started = list(map(_JOB_ID, map(JOB, chosen)))
        least = map(FIRST, map(FIRST, map(OPTIONS, chosen)))
        requests = list(zip(started, least, strict=True))
        at = len(fixed)
        for i, pick in picks.items():
            requests[at + i] = (started[at + i], elastic[i].options[pick.option][0])
            options[started[at + i]] = pick.option
        assigned.update(operator.assign(requests))
    return outcome


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


_JOB_ID = attrgetter("job_id")
"""A field read in bulk (`map` runs it in C)."""
