"""What every prefix solver answers (`Allocation`, `PrefixSolver`), and the integer ticks
its durations are counted in (see `dp`)."""

from __future__ import annotations

from collections.abc import Mapping
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


def ticks_array(durations: npt.NDArray[np.float64]) -> IntArray:
    """Durations in DP ticks, element by element (`ticks` of an array)."""
    scaled: npt.NDArray[np.float64] = np.minimum(np.rint(durations / RESOLUTION), MAX_TICKS)
    return scaled.astype(np.int64)


OptionArrays = tuple[IndexArray, npt.NDArray[np.float64]]
"""One candidate's allowed unit counts and expected durations, as arrays."""
