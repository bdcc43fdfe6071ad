"""One pool's robust decision: the admission plan over the plan's views of the jobs, then the
paper's allocator on the queue built from the plan (`pool_decision`)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import cast

from tangram_celery.scheduling.backfill import (
    Busy,
    Choice,
    Plan,
    Waiting,
    choose,
    new_waiting,
)
from tangram_celery.scheduling.demand import NO_DEMAND, Demand, job_class
from tangram_celery.scheduling.ersa import (
    Band,
    Entry,
    Queue,
    queue_entry,
    settle,
    settle_queue,
)
from tangram_celery.scheduling.robust.config import RobustConfig
from tangram_celery.scheduling.robust.limits import elastic_cap, reserve_units
from tangram_celery.scheduling.topology import CpuOperator
from tangram_celery.scheduling.types import (
    Core,
    CpuPool,
    Decision,
    Job,
    Option,
    Pool,
    Snapshot,
)


@dataclass(frozen=True)
class Outlook:
    """What `decide_robust` knows beyond the snapshot: the demand forecast per pool name, and
    the running jobs that were started as short."""

    demand: Mapping[str, Demand] = field(default_factory=dict)
    short_running: frozenset[str] = frozenset()


def pool_decision(
    snapshot: Snapshot, pool: Pool, jobs: list[Job], outlook: Outlook, config: RobustConfig
) -> Decision:
    """One pool: plan the starts at minimums, then let the paper's allocator spread units."""
    if not isinstance(pool, CpuPool):
        running = tuple(job for job in snapshot.running if job.key == pool.name)
        return settle(Snapshot(snapshot.now, tuple(jobs), (pool,), running), jobs, config.base)
    demand = outlook.demand.get(pool.name, NO_DEMAND)
    reserve = reserve_units(demand, pool.total, config)
    cap = elastic_cap(demand, pool.total, config)
    now, total = snapshot.now, pool.total
    placeable = [job for job in jobs if job.minimum <= total]
    queue = _views(placeable, cap, now, config)
    fallback = config.base.fallback_duration
    short_running = outlook.short_running
    busy = [
        Busy(job.units, now + fallback if job.expected_finish is None else job.expected_finish,
             job.job_id in short_running)
        for job in snapshot.running if job.key == pool.name
    ]
    choice = choose(queue, busy, total, len(pool.free), reserve, now, config.backfill)
    width = sum(map(_UNITS_OF, choice.chosen)) + choice.long_left
    operator = CpuOperator(pool if width >= len(pool.free) else
                           CpuPool(pool.name, _cores(pool.free, width), total))
    built = _queue(jobs, placeable, choice, cap, operator, config.floor)
    return settle_queue(snapshot, config.base, built, {pool.name: operator})


def _bands(jobs: Sequence[Job], chosen: Plan, cap: int, total: int) -> dict[str, Band]:
    """The units the allocator may give the chosen jobs and the head: from what the plan
    holds them to up to the cap if elastic (up to the pool if not)."""
    held = [*chosen.chosen, *([chosen.head] if chosen.head else [])]
    elastic = {job.job_id for job in jobs if job.is_elastic}
    return {job_id: (units, cap if job_id in elastic else total) for job_id, units in held}


def _queue(jobs: Sequence[Job], placeable: Sequence[Job], choice: Choice, cap: int,
           operator: CpuOperator, floor: int = 1) -> Queue:
    """The allocator's queue for the plan: what `build_queue` builds from the `_reordered`
    jobs with their `_bands` (the chosen jobs in queue order, the head, the rest), each job's
    entry cached on the job (`Job.memo`).

    Every job the plan chooses is held at its minimum (the plan's views start at it, and a
    chosen view is itself or held to its first count), so a chosen job's band is (its
    minimum, the cap if elastic, else the pool): its entry depends on the job, the pool's
    size and the cap alone. The chosen jobs fit (the view has their minimums and the long
    room left), so they are the first candidates; `_fitting` goes on from there."""
    total = operator.pool.total
    usable = operator.usable
    at, later = choice.at, choice.later
    key = f"{_ENTRY}:{total}:{cap}:{floor}"
    held_to = (cap, total, floor)  # a chosen job's band: see `_entry`
    first = [_entry(job, key, usable, None, held_to) for job in placeable[:at]]
    if choice.head is not None:
        first += [_entry(placeable[i], key, usable, None, held_to) for i in later]
        job = placeable[at]
        band = (choice.head.units, cap if job.is_elastic else total)
        held = [_entry(job, "", usable, band)]
        skip = set(later)
        key = f"{_ENTRY}:{total}"
        held += [_entry(job, key, usable, None)
                 for i, job in enumerate(placeable[at + 1 :], at + 1) if i not in skip]
    else:
        held = []
    entries = (*first, *held)
    unplaceable = () if len(placeable) == len(jobs) else tuple(
        job.job_id for job in jobs if job.minimum > total)
    left = len(operator.pool.free) - sum(map(_MINIMUM, first))
    candidates = len(first)
    for entry in entries[candidates:]:  # `_fitting` past the chosen jobs (they fit)
        if entry.options[0][0] > left:
            break
        left -= entry.options[0][0]
        candidates += 1
    return Queue(entries, candidates, unplaceable)


def _entry(job: Job, key: str, usable: Callable[[tuple[Option, ...]], tuple[Option, ...]],
           band: Band | None, held_to: tuple[int, int, int] | None = None) -> Entry:
    """`queue_entry(job, usable, band)` of a placeable job, cached on the job under `key`
    (naming what the entry depends on besides the job; "": not cached). `held_to`: (cap,
    pool size, floor) of a chosen job, whose band is (the floor within its minimum and the
    cap, the cap) if it is elastic, else (its minimum, the pool size).

    The cached entry refers to its job, a reference cycle: a job that leaves the queue is
    freed by the cycle collector rather than at once. Rebuilding the entry from its parts at
    every call instead costs about 0.15 ms at 256 chosen jobs (new tuples, collections)."""
    entry = job.memo.get(key) if key else None
    if entry is not None:
        return cast(Entry, entry)
    if held_to is not None:
        band = ((max(job.minimum, min(held_to[2], held_to[0])), held_to[0]) if job.is_elastic
                else (job.minimum, held_to[1]))
    entry = queue_entry(job, usable, band)
    if entry is None:
        raise AssertionError(f"job {job.job_id!r} is placeable")
    if key:
        job.memo[key] = entry
    return entry


_UNITS = itemgetter(0)
_UNITS_OF = attrgetter("units")
_MINIMUM = attrgetter("minimum")
_ENTRY = "robust.entry"
_WAITING = "robust.waiting"
"""Keys of what `decide_robust` caches in `Job.memo`."""


def _views(jobs: Sequence[Job], cap: int, now: float, config: RobustConfig) -> list[Waiting]:
    """The plan's view of each job (`_view`), cached on the job (`Job.memo`) under what it
    depends on besides the job: so a job that stays queued keeps its view and what the plan
    derives from it."""
    key = (f"{_WAITING}:{config.horizon}:{config.demand.short_s!r}:"
           f"{config.base.fallback_duration!r}:{cap}")
    fresh, late = f"{key}:0", f"{key}:1"
    bypass = config.max_bypass_s
    views = []
    for job in jobs:
        overdue = now - job.submitted_at >= bypass
        memo = job.memo
        view = memo.get(late if overdue else fresh)
        if view is None:
            view = memo[late if overdue else fresh] = _view(job, cap, overdue, config)
        views.append(view)
    return cast(list[Waiting], views)


def _view(job: Job, cap: int, overdue: bool, config: RobustConfig) -> Waiting:
    if job.is_elastic and config.horizon:
        high = max(bisect_right(job.options, cap, key=_UNITS), 1)
        low = min(bisect_left(job.options, min(config.floor, cap), key=_UNITS), high - 1)
        options = job.options[low:high]
    else:
        duration = job.options[0][1]
        fallback = config.base.fallback_duration
        options = ((job.minimum, fallback if duration is None else duration),)
    return new_waiting(
        job.job_id,
        cast(tuple[tuple[int, float], ...], options),  # elastic: every duration is known
        job_class(job, config.demand.short_s) == "short",
        overdue,
    )


def _reordered(jobs: Sequence[Job], chosen: Sequence[str], head: str | None) -> list[Job]:
    """The chosen jobs in queue order, then the head, then everyone else in queue order: the
    allocator's candidate prefix is then exactly the chosen jobs."""
    picked = set(chosen)
    first = [job for job in jobs if job.job_id in picked]
    rest = [job for job in jobs if job.job_id not in picked]
    rest.sort(key=lambda job: job.job_id != head)
    return first + rest


def _cores(free: Sequence[Core], count: int) -> tuple[Core, ...]:
    """`count` free cores, taken from the NUMA groups with the most free cores first (the
    reserve stays in the fragmented groups)."""
    if count >= len(free):
        return tuple(free)
    groups: dict[int, list[Core]] = {}
    for core in free:
        groups.setdefault(core.numa, []).append(core)
    ranked = sorted(groups.values(), key=lambda cores: (-len(cores), cores[0].numa))
    return tuple(core for cores in ranked for core in cores)[:count]
