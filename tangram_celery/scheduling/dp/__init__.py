"""The allocation DP: optimal discrete allocations for every prefix of a candidate list.

Rows are candidates in order, columns are pool states, and `B[k][t]` is the least total
duration of the first k candidates that leaves the pool in state t; each candidate picks one of
its allowed unit counts. Because greedy eviction only ever drops the *last* candidate, the
answer for every eviction step is read from the same table, which is filled once.

Durations enter the DP as integer ticks (`RESOLUTION` seconds, rounded half to even), so sums
are exact and every evaluation order gives the same numbers; this is what lets a vectorised
recurrence reproduce a naive one bit for bit. Ties are broken one way everywhere: among
allocations of least total, take the one whose tuple of option indices read from the last
candidate backwards is lexicographically smallest (the last candidate gets the fewest units,
then the one before it, ...). `reference.python_dp` and the tests implement the rule from the
definition.

Two solvers share the recurrence: `CountSolver` (`dp.counts`) for pools where only the number
of used units matters (CPU cores), and `StateSolver` (`dp.states`) for pools whose feasibility
depends on more than a count (buddy-split GPU chunks). What both answer, and the ticks they
count in, is `dp.allocation`.
"""

from __future__ import annotations

from tangram_celery.scheduling.dp.allocation import (
    Allocation,
    IntArray,
    OptionArrays,
    Pick,
    PrefixSolver,
    State,
    round_ticks,
    ticks,
)
from tangram_celery.scheduling.dp.counts import CountSolver
from tangram_celery.scheduling.dp.states import StateSolver

__all__ = [
    "Allocation",
    "CountSolver",
    "IntArray",
    "OptionArrays",
    "Pick",
    "PrefixSolver",
    "State",
    "StateSolver",
    "round_ticks",
    "ticks",
]
