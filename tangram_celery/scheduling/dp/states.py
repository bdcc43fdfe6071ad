"""`StateSolver`: the prefix DP over explicit pool states, for pools whose feasibility depends
on more than a count (buddy-split GPU chunks).

States are the reachable pool states, indexed once; an option may have several predecessor
states (one free 2-chunk and two free 1-chunks both become one free 1-chunk after a 1-GPU
request), so each row is a min over (option, predecessor) pairs, vectorised over states:
O(n * S * s * r) with S states and r <= log2(node size) + 1 predecessors. The back-track keeps
the set of states still on an optimal path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tangram_celery.scheduling.dp.allocation import (
    INFEASIBLE,
    Allocation,
    IndexArray,
    IntArray,
    OptionArrays,
    Pick,
    State,
    ticks_array,
)

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
            list(zip(units.tolist(), ticks_array(durations).tolist(), strict=True))
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
