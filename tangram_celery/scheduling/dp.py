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

Two solvers share the recurrence:

* `CountSolver` for pools where only the number of used units matters (CPU cores). The state is
  "extra units beyond the minimums so far, at most e", so prefix k is read at the single state
  `budget - sum(minimums of the first k)` (its slack). The table is filled by columns: column
  e needs only columns < e for every option but the minimum, and the minimum option is a
  running (min, +) recurrence down the rows that closes into a cumulative minimum, so each
  column is a handful of numpy operations over all rows at once. Columns are added lazily up to
  the largest slack asked for; eviction step by step adds one or two columns. Work:
  O(n * w * s) for n candidates, w columns used (at most the free units + 1) and s options.
  The back-track follows only the rows where a candidate gets more than its minimum (at most
  the slack of them), found by bisection in per-column lists.
* `StateSolver` for pools whose feasibility depends on more than a count (buddy-split GPU
  chunks). States are the reachable pool states, indexed once; an option may have several
  predecessor states (one free 2-chunk and two free 1-chunks both become one free 1-chunk after
  a 1-GPU request), so each row is a min over (option, predecessor) pairs, vectorised over
  states: O(n * S * s * r) with S states and r <= log2(node size) + 1 predecessors. The
  back-track keeps the set of states still on an optimal path.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
IndexArray = npt.NDArray[np.intp]
State = tuple[int, ...]
"""An abstract pool state from a topology operator (a free-unit count, or chunk counts)."""

RESOLUTION = 1e-6
"""Seconds per DP tick."""
MAX_TICKS = 2**40
"""Durations are capped at this many ticks (about 12.7 days) so sums cannot overflow."""
INFEASIBLE = 2**60
"""Value of a state no allocation reaches."""


class Pick(NamedTuple):
    """A candidate's chosen option index, its unit count and its cost in ticks."""

    option: int
    units: int
    cost: int


@dataclass(frozen=True)
class Allocation:
    """The least total of a prefix in ticks, and the candidates above their minimum.

    `picks` maps a candidate's position to its pick; every other candidate takes option 0.
    """

    total: int
    picks: Mapping[int, Pick]

    def options(self, k: int) -> tuple[int, ...]:
        """The option index of each of the first k candidates."""
        return tuple(self.picks[i].option if i in self.picks else 0 for i in range(k))


class PrefixSolver(Protocol):
    """Answers, for any prefix length k >= 1 of its candidates, the optimal allocation."""

    def solve(self, k: int) -> Allocation:
        """The optimal allocation of the first k candidates (they must fit at minimums)."""
        ...


def ticks(duration: float) -> int:
    """A duration in DP ticks (see `RESOLUTION`), capped at `MAX_TICKS`."""
    return int(min(round(duration / RESOLUTION), MAX_TICKS))


def round_ticks(seconds: float) -> int:
    """A signed time span in ticks, rounded half to even."""
    return round(seconds / RESOLUTION)


def _ticks_array(durations: npt.NDArray[np.float64]) -> IntArray:
    scaled: npt.NDArray[np.float64] = np.minimum(np.rint(durations / RESOLUTION), MAX_TICKS)
    return scaled.astype(np.int64)


OptionArrays = tuple[IndexArray, npt.NDArray[np.float64]]
"""One candidate's allowed unit counts and expected durations, as arrays."""


def _padded(rows: Sequence[OptionArrays]) -> tuple[IndexArray, IntArray, IndexArray]:
    """Rows as (n, s) arrays of unit counts and tick costs, plus the row lengths."""
    lengths = np.array([len(units) for units, _ in rows], dtype=np.intp)
    width = int(lengths.max())
    present = np.arange(width)[None, :] < lengths[:, None]
    units = np.zeros((len(rows), width), dtype=np.intp)
    costs = np.full((len(rows), width), INFEASIBLE, dtype=np.int64)
    units[present] = np.concatenate([u for u, _ in rows])
    costs[present] = _ticks_array(np.concatenate([d for _, d in rows]))
    return units, costs, lengths


class CountSolver:
    """Prefix solver for pools where only the number of units used matters (CPU cores).

    `budget` units are shared by the candidates `rows` (each as `OptionArrays`, so callers can
    reuse conversions across scheduling points); see the module docstring. `CountSolver.padded`
    takes the rows already as padded arrays (callers that cache per-job tick costs).
    """

    def __init__(self, budget: int, rows: Sequence[OptionArrays]) -> None:
        units, costs, lengths = _padded(rows)
        extras = units - units[:, :1]
        present = np.arange(units.shape[1])[None, :] < lengths[:, None]
        contiguous = bool(np.all((extras == np.arange(units.shape[1])) | ~present))
        self._setup(budget, units[:, 0], None if contiguous else extras, costs, present)

    @classmethod
    def padded(
        cls,
        budget: int,
        minimums: IndexArray,
        extras: IndexArray | None,
        costs: IntArray,
        present: npt.NDArray[np.bool_] | None,
    ) -> CountSolver:
        """A solver from padded rows: each candidate's minimum, the extra units of its options
        beyond it ((n, s); None: 0, 1, 2, ... for every row), their tick costs ((n, s),
        `INFEASIBLE` where absent) and which entries are present ((n, s), a prefix of each
        row; None: all)."""
        solver = cls.__new__(cls)
        solver._setup(budget, minimums, extras, costs, present)
        return solver

    def _setup(
        self,
        budget: int,
        minimums: IndexArray,
        extras: IndexArray | None,
        costs: IntArray,
        present: npt.NDArray[np.bool_] | None,
    ) -> None:
        n, width = costs.shape
        self._n = n
        self._stride = n + 1
        self._slack = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(minimums, out=self._slack[1:])
        np.subtract(budget, self._slack, out=self._slack)
        self._acc = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(costs[:, 0], out=self._acc[1:])
        self._stay = costs[:, 0]
        self._cost = np.ascontiguousarray(costs[:, 1:].T)
        self._contiguous = extras is None
        if extras is None:
            self._pad = width - 1
            self._reach = np.arange(1, width)
            self._cost_down = np.ascontiguousarray(self._cost[::-1])
        else:
            if present is None:
                present = np.ones(costs.shape, dtype=np.bool_)
            self._pad = int(extras[present].max())
            self._reach = np.where(present, extras, np.iinfo(np.intp).max)[:, 1:].min(axis=0)
            gather = np.where(present[:, 1:], extras[:, 1:], 1)
            self._base = np.ascontiguousarray((np.arange(n)[:, None] - gather * self._stride).T)
        height = self._pad + max(int(self._slack[1]), 0) + 1
        self._table = np.empty((height, self._stride), dtype=np.int64)
        self._table[: self._pad] = INFEASIBLE
        self._flat = self._table.reshape(-1)
        self._jumps: list[list[int]] = []
        self._moves: list[list[int]] = []
        self._shifts: list[list[int]] = []
        self._extras = extras
        self._costs = costs
        self._minimum: list[int] = minimums.tolist()
        self._rows = n

    def slack(self, k: int) -> int:
        """Units left over when the first k candidates get their minimums."""
        return int(self._slack[k])

    def solve(self, k: int) -> Allocation:
        """The optimal allocation of the first k candidates."""
        slack = self.slack(k)
        if slack < 0 or not 1 <= k <= self._n:
            raise ValueError(f"the first {k} candidates do not fit at their minimums")
        if k > self._rows:
            self._jumps, self._moves, self._shifts, self._rows = [], [], [], k
        while len(self._jumps) <= slack:
            self._column(len(self._jumps), k)
        self._rows = min(self._rows, k)
        return Allocation(int(self._table[self._pad + slack, k]), self._trace(k, slack))

    def _column(self, e: int, rows: int) -> None:
        line = self._table[self._pad + e]
        acc = self._acc[1 : rows + 1]
        reach = self._options_within(e)
        line[0] = 0
        if reach == 0:  # only minimums fit: every row stays
            line[1 : rows + 1] = acc
            self._jumps.append([])
            self._moves.append([])
            self._shifts.append([])
            return
        top = self._pad + e
        if self._contiguous:  # option j sits j rows up: a plain slice, largest extra first
            width = len(self._cost_down)
            candidates = (
                self._table[top - reach : top, :rows] + self._cost_down[width - reach :, :rows]
            )
            candidates = candidates[::-1]
        else:
            earlier = np.take(self._flat, self._base[:reach, :rows] + top * self._stride)
            candidates = earlier + self._cost[:reach, :rows]
        best = candidates.min(axis=0)
        best -= acc
        np.minimum.accumulate(best, out=best)
        np.minimum(best, 0, out=best)
        best += acc
        line[1 : rows + 1] = best
        jumped = np.flatnonzero(best != line[:rows] + self._stay[:rows])
        options = candidates[:, jumped].argmin(axis=0) + 1
        self._jumps.append((jumped + 1).tolist())
        picked = options.tolist()
        self._moves.append(picked)
        if self._extras is None:
            self._shifts.append(picked)
        else:
            self._shifts.append(self._extras[jumped, options].tolist())

    def _options_within(self, e: int) -> int:
        """How many option columns beyond the minimum some row can use in column e."""
        if self._contiguous:
            return min(e, len(self._reach))
        return int(np.searchsorted(self._reach, e, side="right"))

    def _trace(self, k: int, e: int) -> dict[int, Pick]:
        """Follow the rows where a candidate takes more than its minimum, last first."""
        picks: dict[int, Pick] = {}
        jumps, moves, shifts, minimum = self._jumps, self._moves, self._shifts, self._minimum
        costs, new = self._costs, tuple.__new__
        while e > 0 and k > 0:
            rows = jumps[e]
            at = bisect_right(rows, k) - 1
            if at < 0:
                break
            k = rows[at]
            option, extra = moves[e][at], shifts[e][at]
            cost = int(costs[k - 1, option])
            picks[k - 1] = new(Pick, (option, minimum[k - 1] + extra, cost))  # Pick(...)
            e -= extra
            k -= 1
        return picks


Place = Callable[[State, int], State | None]


@dataclass(frozen=True)
class Layer:
    """One candidate's row: predecessor states per (option, predecessor) pair and their costs.

    `pred[c, t]` is the state of the previous row from which pair c leads to state t, or the
    state count (a sentinel) when none does.
    """

    pred: IndexArray
    cost: IntArray


class StateSolver:
    """Prefix solver over explicit pool states (GPU chunk counts) reached by `place`.

    States are enumerated once from `start` by placing every unit count any candidate allows;
    their number is the table width (see `topology.GpuOperator` for its bound).
    """

    def __init__(self, start: State, place: Place, arrays: Sequence[OptionArrays]) -> None:
        rows = [
            list(zip(units.tolist(), _ticks_array(durations).tolist(), strict=True))
            for units, durations in arrays
        ]
        self._rows = rows
        sizes = sorted({units for row in rows for units, _ in row})
        states = _reachable(start, place, sizes)
        index = {state: i for i, state in enumerate(states)}
        self._sources = {size: _sources(states, index, place, size) for size in sizes}
        shapes: dict[tuple[int, ...], tuple[IndexArray, IndexArray]] = {}
        self._layers = [_state_layer(row, self._sources, len(states), shapes) for row in rows]
        initial = np.full(len(states), INFEASIBLE, dtype=np.int64)
        initial[index[start]] = 0
        self._values = _fill(initial, self._layers)
        self._lists: dict[int, list[int]] = {}
        self.state_count = len(states)

    def solve(self, k: int) -> Allocation:
        """The optimal allocation of the first k candidates."""
        values = self._row(k)
        best = min(values)
        if best >= INFEASIBLE:
            raise ValueError(f"the first {k} candidates do not fit at their minimums")
        options = self._trace(k, {t for t, value in enumerate(values) if value == best})
        picks = {
            i: Pick(option, *self._rows[i][option]) for i, option in enumerate(options) if option
        }
        return Allocation(best, picks)

    def _row(self, k: int) -> list[int]:
        if k not in self._lists:
            self._lists[k] = self._values[k].tolist()
        return self._lists[k]

    def _trace(self, k: int, live: set[int]) -> list[int]:
        """Back-track with the set of states still on an optimal path, last candidate first."""
        picks: list[int] = []
        for row in range(k, 0, -1):
            before, after = self._row(row - 1), self._row(row)
            pick = len(self._rows[row - 1])
            sources: set[int] = set()
            for state in live:
                target = after[state]
                for option, (units, cost) in enumerate(self._rows[row - 1]):
                    if option > pick:
                        break
                    for source in self._sources[units][state]:
                        if before[source] + cost == target:
                            if option < pick:
                                pick, sources = option, set()
                            sources.add(source)
            picks.append(pick)
            live = sources
        picks.reverse()
        return picks


def _fill(initial: IntArray, layers: Sequence[Layer]) -> list[IntArray]:
    values = [initial]
    for layer in layers:
        padded = np.append(values[-1], INFEASIBLE)
        candidates = padded[layer.pred]
        candidates += layer.cost[:, None]
        best = candidates.min(axis=0)
        np.minimum(best, INFEASIBLE, out=best)
        values.append(best)
    return values


def _reachable(start: State, place: Place, sizes: Sequence[int]) -> list[State]:
    seen = {start}
    order = [start]
    frontier = [start]
    while frontier:
        following: list[State] = []
        for state in frontier:
            for size in sizes:
                nxt = place(state, size)
                if nxt is not None and nxt not in seen:
                    seen.add(nxt)
                    order.append(nxt)
                    following.append(nxt)
        frontier = following
    return order


def _sources(
    states: Sequence[State], index: dict[State, int], place: Place, size: int
) -> list[list[int]]:
    """For each state, the states from which placing `size` units leads to it."""
    sources: list[list[int]] = [[] for _ in states]
    for i, state in enumerate(states):
        nxt = place(state, size)
        if nxt is not None:
            sources[index[nxt]].append(i)
    return sources


def _state_layer(
    row: Sequence[tuple[int, int]],
    sources: dict[int, list[list[int]]],
    width: int,
    shapes: dict[tuple[int, ...], tuple[IndexArray, IndexArray]],
) -> Layer:
    """The row's (option, predecessor) pairs; the shape is shared by rows with equal units."""
    units = tuple(count for count, _ in row)
    if units not in shapes:
        blocks = [_predecessor_table(sources[count], width) for count in units]
        lengths = np.array([len(block) for block in blocks], dtype=np.intp)
        shapes[units] = (np.concatenate(blocks, axis=0), lengths)
    pred, lengths = shapes[units]
    return Layer(pred, np.repeat(np.array([c for _, c in row], dtype=np.int64), lengths))


def _predecessor_table(sources: list[list[int]], width: int) -> IndexArray:
    depth = max(1, max(len(found) for found in sources))
    table = np.full((depth, width), width, dtype=np.intp)
    for target, found in enumerate(sources):
        table[: len(found), target] = found
    return table
