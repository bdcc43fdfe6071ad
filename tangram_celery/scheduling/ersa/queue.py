"""The allocator's queue: the placeable jobs in order with the options their pools can serve,
and the candidate prefix that fits with every job at its minimum (step 2 of `ersa`)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import NamedTuple

from tangram_celery.scheduling.topology import CpuOperator, Operator
from tangram_celery.scheduling.types import Job, Option


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


JOB = itemgetter(0)
OPTIONS = itemgetter(1)
FIRST = itemgetter(0)
"""Fields read in bulk (`map` runs them in C): an entry's job and its options, and the first
item of a tuple (an option's unit count, a job's first option)."""
