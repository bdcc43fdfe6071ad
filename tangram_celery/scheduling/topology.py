"""Topology operators: how a pool's units are counted, placed and finally handed out.

An operator turns a pool into an abstract state (a tuple of ints), says whether a request of
k units can be placed on a state and what state results, builds the DP solver for its kind of
state, and at the end picks concrete unit ids for the admitted jobs. The scheduler (`ersa`)
talks only to this interface, so one DP serves CPU and GPU pools.

* `CpuOperator`: cores are exchangeable for feasibility, so the state is the free-core count.
  Concrete cores prefer one NUMA group (the fullest fit: the group with the fewest free cores
  that still holds the whole request) and, inside it, the run of free ids with the smallest
  span. Larger requests are served first; a request no group can hold takes whole groups,
  fullest first, and best-fits the rest.
* `GpuOperator`: free GPUs form aligned power-of-two chunks (1, 2, 4, ... node_size, never
  crossing a node, buddy style). The state is the count of free chunks of each size. A request
  for k GPUs (a power of two) must be one aligned chunk: it takes the smallest free chunk of
  size >= k (best fit) at the lowest id and splits the rest buddy style into free chunks of
  sizes k, 2k, ... . We read the design's "taken greedily from the largest chunks" as "keep the
  largest chunks whole": best fit leaves a free-chunk multiset that dominates any other choice
  (a split chunk only ever replaces a larger one by smaller pieces of the same total), and with
  power-of-two sizes whether a set of requests fits does not depend on the order in which they
  are placed (checked exhaustively in the tests), so the FCFS fit test and the DP agree.
  DP states: each count of a chunk size below node_size is at most max(initial count, 1)
  (best fit only creates a piece of a size none of which is free), so there are at most
  prod(max(c_j, 1) + 1) * (c_top + 1) states; for an unfragmented pool of m GPUs that is
  8 * (m / node_size + 1) <= m + 8, keeping the DP at O(n * m * s) with s <= 4 predecessors per
  option.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tangram_celery.scheduling.dp import (
    CountSolver,
    OptionArrays,
    PrefixSolver,
    State,
    StateSolver,
)
from tangram_celery.scheduling.types import CpuPool, GpuPool, Job, Option, Pool

Request = tuple[str, int]
"""A job id and the number of units it gets."""


class Operator(Protocol):
    """The scheduler's view of one pool's topology."""

    @property
    def name(self) -> str:
        """The pool's name (a job's `key`)."""
        ...

    @property
    def start(self) -> State:
        """The pool's state now."""
        ...

    def accepts(self, units: int) -> bool:
        """Whether a request of `units` could ever be served by this pool."""
        ...

    def usable(self, options: tuple[Option, ...]) -> tuple[Option, ...]:
        """The options whose unit counts the pool could ever serve."""
        ...

    def place(self, state: State, units: int) -> State | None:
        """The state after placing a request of `units`, or None if it does not fit."""
        ...

    def free_units(self, state: State) -> int:
        """How many units are free in `state`."""
        ...

    def solver(self, state: State, rows: Sequence[OptionArrays]) -> PrefixSolver:
        """The prefix DP for candidates with the allowed options `rows`, placed from `state`."""
        ...

    def assign(self, requests: Sequence[Request]) -> dict[str, tuple[int, ...]]:
        """Concrete unit ids for `requests`, placed in order from the pool's state now."""
        ...


def operator_for(pool: Pool) -> Operator:
    """The topology operator of `pool`."""
    if isinstance(pool, CpuPool):
        return CpuOperator(pool)
    return GpuOperator(pool)


def usable_options(job: Job, operator: Operator) -> tuple[Option, ...]:
    """The options of `job` the pool could ever serve (empty: the job is unplaceable)."""
    return operator.usable(job.options)


@dataclass(frozen=True)
class CpuOperator:
    """Cores of one node: any free cores fit; concrete ones prefer one NUMA group."""

    pool: CpuPool

    @property
    def name(self) -> str:
        """The pool's name."""
        return self.pool.name

    @property
    def start(self) -> State:
        """The free-core count, as a one-element state."""
        return (len(self.pool.free),)

    def accepts(self, units: int) -> bool:
        """Whether the node has at least `units` cores."""
        return 1 <= units <= self.pool.total

    def usable(self, options: tuple[Option, ...]) -> tuple[Option, ...]:
        """The options needing no more cores than the node has."""
        if options[-1][0] <= self.pool.total:
            return options
        return tuple(option for option in options if option[0] <= self.pool.total)

    def place(self, state: State, units: int) -> State | None:
        """Take `units` cores from the free count."""
        return (state[0] - units,) if units <= state[0] else None

    def free_units(self, state: State) -> int:
        """The free-core count."""
        return state[0]

    def solver(self, state: State, rows: Sequence[OptionArrays]) -> PrefixSolver:
        """A count DP over the free cores."""
        return CountSolver(state[0], rows)

    def assign(self, requests: Sequence[Request]) -> dict[str, tuple[int, ...]]:
        """Concrete core ids, largest requests first, each in as few NUMA groups as possible.

        Single-core requests, served last, drain the groups from the fullest (fewest free
        cores) up, lowest id first, which is what serving them one by one would do.
        """
        groups: dict[int, list[int]] = {}
        for core in self.pool.free:
            groups.setdefault(core.numa, []).append(core.core_id)
        for ids in groups.values():
            ids.sort()
        sizes = [-count for _, count in requests]
        order = sorted(range(len(requests)), key=sizes.__getitem__)  # stable: ties keep order
        result: dict[str, tuple[int, ...]] = {}
        singles = [requests[i][0] for i in order if requests[i][1] == 1]
        for i in order[: len(order) - len(singles)]:
            job_id, count = requests[i]
            result[job_id] = tuple(sorted(_take_cores(groups, count)))
        drain = sorted((len(ids), group) for group, ids in groups.items() if ids)
        cores = [core for _, group in drain for core in groups[group]]
        if len(cores) < len(singles):
            raise ValueError("not enough free cores for the admitted jobs")
        result.update((job_id, (core,)) for job_id, core in zip(singles, cores, strict=False))
        return result


def _take_cores(groups: dict[int, list[int]], count: int) -> list[int]:
    taken: list[int] = []
    while count > 0:
        group = _fullest_fit(groups, count)
        ids = groups[group]
        if len(ids) >= count:
            start = _closest(ids, count)
            taken += ids[start : start + count]
            del ids[start : start + count]
            return taken
        taken += ids
        count -= len(ids)
        groups[group] = []
    return taken


def _fullest_fit(groups: dict[int, list[int]], count: int) -> int:
    """The group with the fewest free cores that holds `count`, else the one with the most."""
    best, best_key = -1, (0, 0, 0)
    for group, ids in groups.items():
        size = len(ids)
        key = (0, size, group) if size >= count else (1, -size, group)
        if size and (best < 0 or key < best_key):
            best, best_key = group, key
    if best < 0:
        raise ValueError("not enough free cores for the admitted jobs")
    return best


def _closest(ids: Sequence[int], count: int) -> int:
    """Where the run of `count` consecutive free ids with the smallest span starts."""
    if count == 1:
        return 0
    spans = [last - first for first, last in zip(ids, ids[count - 1 :], strict=False)]
    return spans.index(min(spans))


@dataclass(frozen=True)
class GpuOperator:
    """GPUs in aligned power-of-two chunks, buddy split, best fit."""

    pool: GpuPool
    levels: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "levels", self.pool.node_size.bit_length())

    @property
    def name(self) -> str:
        """The pool's name."""
        return self.pool.name

    @property
    def start(self) -> State:
        """Counts of free chunks of size 1, 2, 4, ... node_size."""
        counts = [0] * self.levels
        for _, size in free_chunks(self.pool):
            counts[size.bit_length() - 1] += 1
        return tuple(counts)

    def accepts(self, units: int) -> bool:
        """Whether `units` is a power of two no larger than a node."""
        return 0 < units <= self.pool.node_size and units & (units - 1) == 0

    def usable(self, options: tuple[Option, ...]) -> tuple[Option, ...]:
        """The options asking for one aligned chunk (a power of two up to the node size)."""
        return tuple(option for option in options if self.accepts(option[0]))

    def place(self, state: State, units: int) -> State | None:
        """Best fit: split the smallest free chunk of size >= `units`."""
        level = units.bit_length() - 1
        for source in range(level, len(state)):
            if state[source] > 0:
                counts = list(state)
                counts[source] -= 1
                for piece in range(level, source):
                    counts[piece] += 1
                return tuple(counts)
        return None

    def free_units(self, state: State) -> int:
        """Total free GPUs in `state`."""
        return sum(count << level for level, count in enumerate(state))

    def solver(self, state: State, rows: Sequence[OptionArrays]) -> PrefixSolver:
        """A DP over reachable chunk-count states."""
        return StateSolver(state, self.place, rows)

    def assign(self, requests: Sequence[Request]) -> dict[str, tuple[int, ...]]:
        """Concrete GPU ids: each request best-fits the free chunks, lowest id first."""
        chunks = free_chunks(self.pool)
        result: dict[str, tuple[int, ...]] = {}
        for job_id, units in requests:
            fitting = [chunk for chunk in chunks if chunk[1] >= units]
            if not fitting or not self.accepts(units):
                raise ValueError(f"no free aligned chunk of {units} GPUs for job {job_id!r}")
            start, size = min(fitting, key=lambda chunk: (chunk[1], chunk[0]))
            chunks.remove((start, size))
            piece = units
            while piece < size:
                chunks.append((start + piece, piece))
                piece *= 2
            result[job_id] = tuple(range(start, start + units))
        return result


def free_chunks(pool: GpuPool) -> list[tuple[int, int]]:
    """The maximal aligned free chunks of `pool` as (first id, size), in id order."""
    free = set(pool.free)
    chunks: list[tuple[int, int]] = []

    def split(start: int, size: int) -> None:
        if all(gpu in free for gpu in range(start, start + size)):
            chunks.append((start, size))
        elif size > 1:
            split(start, size // 2)
            split(start + size // 2, size // 2)

    for base in range(0, pool.total, pool.node_size):
        split(base, pool.node_size)
    return chunks
