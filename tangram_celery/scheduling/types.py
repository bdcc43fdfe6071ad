"""Plain input and output data of the scheduler: frozen dataclasses, checked on construction.

The one addition to plain data is derived data cached on each `Job` (`option_arrays`, a cached
array view of its options, `option_ticks`, `is_elastic`, `runs`, and `memo`, scratch space for
schedulers), so a job that waits through several scheduling points is converted once.

Inputs describe one scheduling point: the waiting jobs, the pools with their free units and
topology, the running jobs and the clock. Outputs are a `Decision`: which jobs start now and on
which concrete units (core ids or GPU ids).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import chain, pairwise
from operator import attrgetter, itemgetter
from typing import Any, Generic, TypeVar, overload

import numpy as np
import numpy.typing as npt

from tangram_celery.scheduling.dp.allocation import MAX_TICKS, RESOLUTION
from tangram_celery.scheduling.residency import Resident

_Owner = TypeVar("_Owner")
_Value = TypeVar("_Value")


class derived(Generic[_Owner, _Value]):
    """`functools.cached_property` without its lock (before Python 3.12 it takes one at every
    first access, which costs more than most of what it caches here): the value is computed
    once and stored in the instance's `__dict__`, which from then on shadows this non-data
    descriptor. For data derived from frozen dataclasses, never part of their equality."""

    def __init__(self, compute: Callable[[_Owner], _Value]) -> None:
        self.compute = compute
        self.name = compute.__name__
        self.__doc__ = compute.__doc__

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type[Any] | None = None) -> derived[_Owner, _Value]:
        ...

    @overload
    def __get__(self, instance: _Owner, owner: type[Any] | None = None) -> _Value:
        ...

    def __get__(self, instance: _Owner | None, owner: type[Any] | None = None
                ) -> _Value | derived[_Owner, _Value]:
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.compute(instance)
        return value


Option = tuple[int, float | None]
"""An allowed unit count of a job's key resource and the expected duration at it (None: unknown)."""


def _is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


@dataclass(frozen=True)
class Core:
    """One CPU core: its id and the NUMA group it belongs to."""

    core_id: int
    numa: int = 0


@dataclass(frozen=True)
class CpuPool:
    """The cores of one CPU node: `free` are available now, `total` is the node's core count.

    Any set of free cores can serve a request; the concrete choice prefers one NUMA group and
    close ids.
    """

    name: str
    free: tuple[Core, ...]
    total: int

    def __post_init__(self) -> None:
        ids = [core.core_id for core in self.free]
        if len(set(ids)) != len(ids):
            raise ValueError(f"pool {self.name!r}: duplicate free core ids; list each core once")
        if self.total < len(ids):
            raise ValueError(f"pool {self.name!r}: total {self.total} < {len(ids)} free cores")


@dataclass(frozen=True)
class Service:
    """A GPU service a pool can load: for each chunk size it may run at, the memory it needs on
    each GPU of the chunk (MB) and the seconds a restore (load) onto such a chunk takes."""

    name: str
    memory_mb: tuple[tuple[int, int], ...] = ()
    restore_s: tuple[tuple[int, float], ...] = ()

    def memory_at(self, units: int) -> int:
        """Memory per GPU (MB) on a chunk of `units` GPUs (0: not given)."""
        return dict(self.memory_mb).get(units, 0)

    def restore_at(self, units: int) -> float | None:
        """Seconds to restore onto a chunk of `units` GPUs (None: not given)."""
        return dict(self.restore_s).get(units)


@dataclass(frozen=True)
class GpuPool:
    """GPUs with ids 0..total-1 in nodes of `node_size` GPUs (a power of two, usually 8).

    Units are handed out as aligned power-of-two chunks (1, 2, 4, ... node_size) that never cross
    a node; `free` lists the ids available now.

    Residency (used by the service-aware scheduler, `replicas`; the paper's allocator ignores
    it): `residents` are the services loaded now, on GPU ids of this pool; `services` the
    memory and restore time of the services jobs may ask for (`Job.service`); `memory_mb` the
    memory of each GPU for residents (0: residents never need evicting).
    """

    name: str
    free: tuple[int, ...]
    total: int
    node_size: int = 8
    residents: tuple[Resident, ...] = ()
    services: tuple[Service, ...] = ()
    memory_mb: int = 0

    def __post_init__(self) -> None:
        if not _is_power_of_two(self.node_size):
            raise ValueError(f"pool {self.name!r}: node_size must be a power of two")
        if self.total % self.node_size:
            raise ValueError(f"pool {self.name!r}: total must be a multiple of node_size")
        if len(set(self.free)) != len(self.free):
            raise ValueError(f"pool {self.name!r}: duplicate free GPU ids; list each GPU once")
        if any(not 0 <= gpu < self.total for gpu in self.free):
            raise ValueError(f"pool {self.name!r}: free GPU ids must lie in 0..{self.total - 1}")
        if any(not 0 <= gpu < self.total for r in self.residents for gpu in r.chunk):
            raise ValueError(f"pool {self.name!r}: resident GPU ids must lie in "
                             f"0..{self.total - 1}")
        if self.memory_mb < 0:
            raise ValueError(f"pool {self.name!r}: memory_mb must be >= 0")


Pool = CpuPool | GpuPool


@dataclass(frozen=True)
class Job:
    """A waiting job (an action) as the scheduler sees it.

    `key` names the pool of its key resource. `options` lists the allowed unit counts of that
    resource in ascending order with the expected duration at each; the first is the minimum.
    `service` names the GPU service it runs on (a model; empty: none), for schedulers that
    know residency.
    A job is treated as elastic only if `elastic` is set, it has more than one option and every
    duration is known; otherwise it is admitted at its minimum. `demands` carries non-key
    demands (for example memory); `decide` ignores them.
    """

    job_id: str
    key: str
    options: tuple[Option, ...]
    submitted_at: float
    elastic: bool = True
    demands: tuple[tuple[str, float], ...] = ()
    service: str = ""
    known: bool = field(init=False, repr=False, compare=False)
    """Whether every option's duration is known (derived)."""

    def __post_init__(self) -> None:
        fields = vars(self)
        known = fields["known"] = all(d is not None for _, d in self.options)
        if not self.options:
            raise ValueError(f"job {self.job_id!r}: give at least one allowed unit count")
        units = [count for count, _ in self.options]
        if units[0] < 1 or any(b <= a for a, b in pairwise(units)):
            raise ValueError(f"job {self.job_id!r}: unit counts must be positive and ascending")
        if any(d is not None and not d > 0 for _, d in self.options):
            raise ValueError(f"job {self.job_id!r}: durations must be positive (or None)")
        fields["is_elastic"] = self.elastic and known and len(units) > 1
        fields["runs"] = units[-1] - units[0] == len(units) - 1

    @property
    def minimum(self) -> int:
        """The smallest allowed unit count."""
        return self.options[0][0]

    @derived
    def is_elastic(self) -> bool:
        """Whether the scheduler may give this job more than its minimum (derived; set on
        construction, from the unit counts it checks, so no decision pays for it)."""
        return self.elastic and self.known and len(self.options) > 1

    @derived
    def option_arrays(self) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64]]:
        """`options` as arrays of unit counts and durations (NaN: unknown), built once.

        Derived data, cached on the instance (not part of equality): a job that stays in the
        queue across scheduling points is converted only once.
        """
        return option_arrays(self.options)

    @derived
    def option_ticks(self) -> npt.NDArray[np.int64]:
        """Each option's expected duration in DP ticks (`dp.ticks`: `dp.RESOLUTION` seconds,
        rounded half to even, at most `dp.MAX_TICKS`); -1 where unknown. Cached like
        `option_arrays`."""
        return _option_ticks(self.option_arrays[1])

    @derived
    def runs(self) -> bool:
        """Whether the unit counts are consecutive (derived; set on construction)."""
        return self.options[-1][0] - self.options[0][0] == len(self.options) - 1

    @derived
    def memo(self) -> dict[object, object]:
        """Scratch space where schedulers cache what they derive from this job alone (keyed
        by what it depends on); not part of equality."""
        return {}


@dataclass(frozen=True)
class RunningJob:
    """A job holding `units` units of pool `key` until `expected_finish` (None: unknown).

    `ids`: the concrete unit ids it holds, and `service`: the GPU service it runs, where the
    caller knows them (schedulers that plan on concrete GPUs need them; others ignore them).
    """

    job_id: str
    key: str
    units: int
    expected_finish: float | None
    ids: tuple[int, ...] = ()
    service: str = ""


@dataclass(frozen=True)
class Snapshot:
    """Everything one scheduling point needs: the clock, the queue, the pools, what runs.

    `waiting` is in arrival (FCFS) order; the configured ordering policy may reorder it.
    """

    now: float
    waiting: tuple[Job, ...]
    pools: tuple[Pool, ...]
    running: tuple[RunningJob, ...] = ()

    def __post_init__(self) -> None:
        names = [pool.name for pool in self.pools]
        if len(set(names)) != len(names):
            raise ValueError("pool names must be unique within one snapshot")
        ids = [job.job_id for job in self.waiting]
        if len(set(ids)) != len(ids):
            raise ValueError("waiting job ids must be unique within one snapshot")


@dataclass(frozen=True)
class Start:
    """Start `job_id` now on the concrete `units` (core ids or GPU ids) of pool `key`."""

    job_id: str
    key: str
    units: tuple[int, ...]
    expected_duration: float | None

    @property
    def count(self) -> int:
        """How many units the job gets."""
        return len(self.units)


@dataclass(frozen=True)
class GroupOutcome:
    """How the elastic candidates of one pool were settled.

    `candidates` are the elastic candidates in order, the first `admitted` of them start;
    `objectives[i]` is the objective with `len(candidates) - i` of them admitted, for each
    eviction step evaluated (the last entry is the first one that did not fall, if any).
    """

    key: str
    candidates: tuple[str, ...]
    admitted: int
    objectives: tuple[float, ...]


@dataclass(frozen=True)
class Decision:
    """The outcome of one scheduling point, as data.

    `starts` in placement order; `deferred` are elastic candidates evicted back to the queue;
    `unplaceable` are jobs that can never run on their pool as described (unknown pool, or no
    allowed unit count the pool's topology can ever serve): the caller should fail them.
    """

    starts: tuple[Start, ...]
    deferred: tuple[str, ...] = ()
    unplaceable: tuple[str, ...] = ()
    groups: tuple[GroupOutcome, ...] = ()

    def units_of(self, job_id: str) -> tuple[int, ...] | None:
        """The units given to `job_id`, or None if it does not start now."""
        for start in self.starts:
            if start.job_id == job_id:
                return start.units
        return None


def option_arrays(
    options: tuple[Option, ...],
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64]]:
    """Options as arrays of unit counts and durations (NaN where unknown)."""
    units = np.array([count for count, _ in options], dtype=np.intp)
    durations = np.array([np.nan if d is None else d for _, d in options], dtype=np.float64)
    return units, durations


def _option_ticks(durations: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    known = ~np.isnan(durations)
    scaled = np.minimum(np.rint(np.where(known, durations, 0.0) / RESOLUTION), MAX_TICKS)
    return np.where(known, scaled.astype(np.int64), -1)


def prime_option_ticks(jobs: Iterable[Job]) -> None:
    """Fill the `option_ticks` cache of many jobs with one conversion for all of them."""
    todo = [job for job in jobs if "option_ticks" not in vars(job)]
    if not todo:
        return
    size = sum(map(len, map(_OPTIONS, todo)))
    if all(map(_KNOWN, todo)):
        flat = np.fromiter(map(_DURATION, chain.from_iterable(map(_OPTIONS, todo))), np.float64,
                           size)
    else:
        flat = np.fromiter([np.nan if d is None else d for job in todo for _, d in job.options],
                           np.float64, size)
    ticks = _option_ticks(flat)
    start = 0
    for job in todo:
        end = start + len(job.options)
        vars(job)["option_ticks"] = ticks[start:end]
        start = end


_OPTIONS = attrgetter("options")
_KNOWN = attrgetter("known")
_DURATION = itemgetter(1)


def prime_option_arrays(jobs: Iterable[Job]) -> None:
    """Fill the `option_arrays` cache of many jobs with one conversion for all of them."""
    todo = [job for job in jobs if "option_arrays" not in vars(job)]
    if not todo:
        return
    size = sum(len(job.options) for job in todo)
    units = np.fromiter([count for job in todo for count, _ in job.options], np.intp, size)
    if all(job.known for job in todo):
        flat = [d for job in todo for _, d in job.options]
    else:
        flat = [np.nan if d is None else d for job in todo for _, d in job.options]
    durations = np.fromiter(flat, np.float64, size)
    start = 0
    for job in todo:
        end = start + len(job.options)
        vars(job)["option_arrays"] = (units[start:end], durations[start:end])
        start = end


def options_from_elasticity(
    allowed: Iterable[int],
    t1: float | None,
    efficiency: Callable[[int], float] | None,
) -> tuple[Option, ...]:
    """Build `Job.options` from allowed unit counts, a single-unit duration and E(m).

    Duration at m units is `t1 / (efficiency(m) * m)`. With `t1` unknown every duration is
    None. With `efficiency` unknown the job is not elastic: only a minimum of one unit keeps a
    duration (`t1` itself; nothing is assumed about other counts), so `decide` admits it at
    its minimum, using `fallback_duration` where even that is unknown.
    """
    counts = sorted(set(allowed))
    if not counts:
        raise ValueError("give at least one allowed unit count")
    if t1 is None:
        return tuple((count, None) for count in counts)
    if efficiency is None:
        first = counts[0]
        return ((first, t1 if first == 1 else None), *((c, None) for c in counts[1:]))
    return tuple((count, t1 / (efficiency(count) * count)) for count in counts)
