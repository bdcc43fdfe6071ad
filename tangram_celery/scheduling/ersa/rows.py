"""The DP's rows for one pool's elastic candidates, read from the jobs' cached arrays (and
tick costs) wherever the candidates' options are a run of their jobs' (see `dp`)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import attrgetter, is_, itemgetter
from typing import cast

import numpy as np

from tangram_celery.scheduling.dp import CountSolver, IntArray, OptionArrays, PrefixSolver, State
from tangram_celery.scheduling.dp.allocation import INFEASIBLE
from tangram_celery.scheduling.ersa.queue import JOB, Entry
from tangram_celery.scheduling.topology import CpuOperator, Operator
from tangram_celery.scheduling.types import (
    option_arrays,
    prime_option_arrays,
    prime_option_ticks,
)


def prefix_solver(operator: Operator, state: State, elastic: Sequence[Entry],
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
    jobs = list(map(JOB, elastic))
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


_LEAD = itemgetter(3)
_TICKS = attrgetter("option_ticks")
_FIELDS = attrgetter("__dict__")
_RUNS = attrgetter("runs")
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
