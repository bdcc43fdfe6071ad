"""`CountSolver`: the prefix DP for pools where only the used unit count matters (CPU cores).

The state is "extra units beyond the minimums so far, at most e", so prefix k is read at the
single state `budget - sum(minimums of the first k)` (its slack). The table is filled by
columns: column e needs only columns < e for every option but the minimum, and the minimum
option is a running (min, +) recurrence down the rows that closes into a cumulative minimum, so
each column is a handful of numpy operations over all rows at once. Columns are added lazily up
to the largest slack asked for; eviction step by step adds one or two columns. Work:
O(n * w * s) for n candidates, w columns used (at most the free units + 1) and s options. The
back-track follows only the rows where a candidate gets more than its minimum (at most the
slack of them), found by bisection in per-column lists.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from tangram_celery.scheduling.dp.allocation import (
    INFEASIBLE,
    Allocation,
    IndexArray,
    IntArray,
    OptionArrays,
    Pick,
    ticks_array,
)


def _padded(rows: Sequence[OptionArrays]) -> tuple[IndexArray, IntArray, IndexArray]:
    """Rows as (n, s) arrays of unit counts and tick costs, plus the row lengths."""
    lengths = np.array([len(units) for units, _ in rows], dtype=np.intp)
    width = int(lengths.max())
    present = np.arange(width)[None, :] < lengths[:, None]
    units = np.zeros((len(rows), width), dtype=np.intp)
    costs = np.full((len(rows), width), INFEASIBLE, dtype=np.int64)
    units[present] = np.concatenate([u for u, _ in rows])
    costs[present] = ticks_array(np.concatenate([d for _, d in rows]))
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
