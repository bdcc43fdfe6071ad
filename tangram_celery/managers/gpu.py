"""The GPU manager: evict-on-execution placement of reward services on GPU chunks.

Every (model, parallelism) pair is its own service, and every placement of it on a chunk is its
own Triton model, named ``<model>__dop<k>__g<first gpu>`` (see :func:`service_name`; a manager
with a ``namespace``, such as a GPU pool's name, prefixes ``<namespace>__`` so that several pools
can share one server). Triton's
explicit model control has no "same model, second placement", but its repository API loads any
name from uploaded files with a JSON config override, so the manager loads the model's own
``model.py`` under that name with an ``instance_group`` that places it on exactly the chunk:

* real GPUs: ``[{"kind": "KIND_GPU", "count": 1, "gpus": [4, 5]}]`` (one instance per GPU of the
  chunk; a tensor-parallel model reads the chunk from the ``tangram_gpus`` parameter instead);
* **no GPU on the machine: GPUs are simulated as plain ids on the CPU.** The chunk ``(4, 5)`` then
  loads ``[{"kind": "KIND_CPU", "count": 2}]``: as many CPU instances as simulated GPUs, with
  ``tangram_simulated=true`` in the parameters. Nothing here touches a real GPU.

A request arrives holding a chunk (a tuple of GPU ids) chosen by the scheduler. If its service is
resident on that chunk it runs now; otherwise the least-recently-used residents that overlap the
chunk are unloaded until the model's memory fits on every GPU of the chunk, and the service is
loaded there. At most one action runs per GPU at a time; with ``batch_same_service`` (default) the
exception is a batch: actions for the *same* service on the *same* chunk share it while it is
ready and no earlier waiter needs those GPUs, and Triton's dynamic batching merges them. Waiters
are served first-come first-served among those that overlap, so nobody starves.

The policy is pure: :func:`plan_placement` (shared from :mod:`tangram_celery.scheduling.residency`),
:func:`rank_chunks`, :func:`check_chunk`, :func:`instance_group` take plain data and return a
decision. :class:`GpuManager` keeps the state, waits for GPUs and calls an :class:`Actuator`
(Triton at the edge, see :class:`tangram_celery.reward.executor.RewardExecutor`) to carry the
decision out.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from tangram_celery.errors import ServiceError, ValidationError
from tangram_celery.scheduling.residency import (
    Chunk,
    Placement,
    Resident,
    memory_used,
    overlaps,
    plan_placement,
    service_name,
)

__all__ = [
    "Actuator",
    "Chunk",
    "GpuManager",
    "Lease",
    "Placement",
    "Resident",
    "check_chunk",
    "instance_group",
    "memory_used",
    "overlaps",
    "placement_parameters",
    "plan_placement",
    "rank_chunks",
    "service_name",
]


# ---------------------------------------------------------------- pure policy
# Residents and placement plans live in :mod:`tangram_celery.scheduling.residency`, shared with
# the service-aware scheduler and the simulator.


def rank_chunks(
    residents: Mapping[str, Resident],
    model: str,
    chunks: Sequence[Chunk],
    memory_mb: int,
    gpu_memory_mb: int,
    busy: frozenset[int] = frozenset(),
    namespace: str = "",
) -> list[Chunk]:
    """``chunks`` best first, for a scheduler that may pick among several free chunks.

    Order: idle before busy; a chunk that already holds the service first; then the fewest
    evictions, the least memory evicted, the lowest GPU id.
    """

    def key(chunk: Chunk) -> tuple[int, int, int, int, int]:
        plan = plan_placement(residents, model, chunk, memory_mb, gpu_memory_mb,
                              namespace=namespace)
        evicted_mb = sum(residents[n].memory_mb * len(residents[n].chunk) for n in plan.evict)
        return (
            int(overlaps(chunk, busy)),
            int(plan.load),
            int(not plan.fits),
            len(plan.evict) * 1_000_000 + evicted_mb,
            chunk[0],
        )

    return sorted(chunks, key=key)


def check_chunk(gpus: Any, pool: Sequence[int], dops: Sequence[int]) -> Chunk:
    """``gpus`` as a chunk of ``pool``, or :class:`ValidationError` on field ``gpus``.

    A chunk is a power-of-two number of distinct GPUs, contiguous and aligned in pool order
    (buddy chunks), whose size is one of the model's allowed parallelisms ``dops``.
    """
    if not isinstance(gpus, list | tuple) or not gpus:
        raise ValidationError("gpus", "give a non-empty list of GPU ids (the scheduler's chunk)")
    if any(isinstance(g, bool) or not isinstance(g, int) for g in gpus):
        raise ValidationError("gpus", f"GPU ids are integers, got {list(gpus)!r}")
    chunk = tuple(int(g) for g in gpus)
    unknown = sorted(set(chunk) - set(pool))
    if unknown:
        raise ValidationError("gpus", f"GPU ids {unknown} are not in this pool {list(pool)}")
    if len(set(chunk)) != len(chunk):
        raise ValidationError("gpus", f"GPU ids repeat in {list(chunk)}")
    if len(chunk) not in dops:
        raise ValidationError("gpus", f"{len(chunk)} GPUs; this model allows {list(dops)}")
    positions = sorted(pool.index(g) for g in chunk)
    size = len(chunk)
    if positions != list(range(positions[0], positions[0] + size)) or positions[0] % size:
        raise ValidationError("gpus", f"{list(chunk)} is not an aligned chunk of {list(pool)}")
    return tuple(pool[p] for p in positions)


def instance_group(chunk: Chunk, simulated: bool) -> list[dict[str, Any]]:
    """The ``instance_group`` that places a service on ``chunk``.

    Real GPUs: one KIND_GPU instance on each GPU id. Simulated GPUs (no GPU on this machine):
    one KIND_CPU instance per GPU id; the ids are only labels.
    """
    if simulated:
        return [{"kind": "KIND_CPU", "count": len(chunk)}]
    return [{"kind": "KIND_GPU", "count": 1, "gpus": list(chunk)}]


def placement_parameters(chunk: Chunk, simulated: bool) -> dict[str, str]:
    """Config parameters telling the model its chunk (for tensor-parallel models)."""
    return {
        "tangram_gpus": ",".join(str(g) for g in chunk),
        "tangram_simulated": "true" if simulated else "false",
    }


# ---------------------------------------------------------------- state and waiting (the edge)


class Actuator(Protocol):
    """Carries a placement out (Triton's repository API in production)."""

    def load(self, name: str, model: str, chunk: Chunk) -> None:
        """Load ``model`` as ``name`` with its instances on ``chunk``."""

    def unload(self, name: str) -> None:
        """Unload ``name``."""


@dataclass
class Lease:
    """A request's hold on its chunk, with what setting it up cost."""

    name: str
    model: str
    chunk: Chunk
    loaded: bool = False
    evicted: list[str] = field(default_factory=list)
    wait_s: float = 0.0
    setup_s: float = 0.0
    joined: bool = False


@dataclass
class _Group:
    name: str
    chunk: Chunk
    holders: int = 1
    ready: bool = False


@dataclass(frozen=True)
class _Waiter:
    ticket: int
    name: str
    chunk: Chunk


class GpuManager:
    """Evict-on-execution over the GPU ids of one pool (thread-safe).

    ``gpu_ids`` are plain ids; on a machine without GPUs they are simulated (see the module
    docstring). ``gpu_memory_mb`` is each GPU's memory for model weights. ``namespace`` prefixes
    the Triton names of this manager's services (:func:`service_name`).
    """

    def __init__(
        self,
        gpu_ids: Sequence[int],
        gpu_memory_mb: int,
        actuator: Actuator,
        *,
        batch_same_service: bool = True,
        wait_timeout_s: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
        namespace: str = "",
    ) -> None:
        if not gpu_ids or len(set(gpu_ids)) != len(gpu_ids):
            raise ValidationError("gpu_ids", f"give distinct GPU ids, got {list(gpu_ids)}")
        if gpu_memory_mb <= 0:
            raise ValidationError("gpu_memory_mb", "must be positive")
        self.gpu_ids = tuple(gpu_ids)
        self.gpu_memory_mb = gpu_memory_mb
        self.actuator = actuator
        self.batch_same_service = batch_same_service
        self.wait_timeout_s = wait_timeout_s
        self.namespace = namespace
        self._clock = clock
        self._cond = threading.Condition()
        self._residents: dict[str, Resident] = {}
        self._owners: dict[int, _Group] = {}
        self._waiters: list[_Waiter] = []
        self._tickets = itertools.count()
        self._tick = itertools.count(1)

    def residents(self) -> dict[str, Resident]:
        """A snapshot of the resident services."""
        with self._cond:
            return dict(self._residents)

    def busy(self) -> frozenset[int]:
        """The GPUs held by running actions now."""
        with self._cond:
            return frozenset(self._owners)

    def rank(self, model: str, chunks: Sequence[Chunk], memory_mb: int) -> list[Chunk]:
        """:func:`rank_chunks` over the current state."""
        with self._cond:
            residents, busy = dict(self._residents), frozenset(self._owners)
        return rank_chunks(residents, model, chunks, memory_mb, self.gpu_memory_mb, busy,
                           self.namespace)

    def forget(self, name: str) -> None:
        """Drop ``name`` from the residents without unloading (Triton lost it, e.g. a restart)."""
        with self._cond:
            self._residents.pop(name, None)

    def retain(self, names: Iterable[str]) -> list[str]:
        """Forget every idle resident not in ``names`` (what the server really holds); returns
        the names forgotten. Residents on GPUs held by running actions are left to those."""
        keep = set(names)
        with self._cond:
            gone = [r.name for r in self._residents.values()
                    if r.name not in keep and not overlaps(r.chunk, self._owners)]
            for name in gone:
                del self._residents[name]
        return gone

    @contextlib.contextmanager
    def lease(self, model: str, memory_mb: int, chunk: Chunk) -> Iterator[Lease]:
        """Hold ``chunk`` with ``model`` resident on it for the duration of the block."""
        if memory_mb > self.gpu_memory_mb:
            raise ServiceError(
                f"{model} needs {memory_mb} MB per GPU but each GPU has {self.gpu_memory_mb} MB; "
                "raise the pool's GPU memory or lower tangram_memory_mb in its config.pbtxt"
            )
        started = self._clock()
        lease, group, placement = self._enter(model, memory_mb, chunk)
        lease.wait_s = self._clock() - started
        try:
            if placement is not None:
                self._carry_out(lease, group, placement, memory_mb)
            yield lease
        finally:
            self._leave(group, lease.name)

    def unload_all(self) -> list[str]:
        """Unload every idle resident (for a clean shutdown); returns their names."""
        with self._cond:
            idle = [r for r in self._residents.values() if not overlaps(r.chunk, self._owners)]
            for resident in idle:
                del self._residents[resident.name]
        for resident in idle:
            with contextlib.suppress(ServiceError):
                self.actuator.unload(resident.name)
        return [r.name for r in idle]

    def _enter(
        self, model: str, memory_mb: int, chunk: Chunk
    ) -> tuple[Lease, _Group, Placement | None]:
        name = service_name(model, chunk, self.namespace)
        waiter = _Waiter(next(self._tickets), name, chunk)
        deadline = None if self.wait_timeout_s is None else self._clock() + self.wait_timeout_s
        with self._cond:
            self._waiters.append(waiter)
            try:
                while not self._may_enter(waiter):
                    remaining = None if deadline is None else deadline - self._clock()
                    if remaining is not None and remaining <= 0:
                        raise ServiceError(
                            f"GPUs {list(chunk)} stayed busy for {self.wait_timeout_s} s; "
                            "the pool is overloaded or an action hangs"
                        )
                    self._cond.wait(remaining)
            finally:
                self._waiters.remove(waiter)
                self._cond.notify_all()
            owner = self._owners.get(chunk[0])
            if owner is not None:
                owner.holders += 1
                self._touch(name)
                return Lease(name, model, chunk, joined=True), owner, None
            group = _Group(name, chunk)
            for gpu in chunk:
                self._owners[gpu] = group
            pinned = frozenset(g.name for g in self._owners.values() if g is not group)
            placement = plan_placement(
                self._residents, model, chunk, memory_mb, self.gpu_memory_mb, pinned,
                self.namespace,
            )
            if placement.load and placement.fits:
                for evicted in placement.evict:
                    del self._residents[evicted]
                self._residents[name] = Resident(name, model, chunk, memory_mb, next(self._tick))
            else:
                self._touch(name)
            return Lease(name, model, chunk), group, placement

    def _may_enter(self, waiter: _Waiter) -> bool:
        for earlier in self._waiters:
            if earlier.ticket >= waiter.ticket:
                break
            if overlaps(earlier.chunk, waiter.chunk):
                return False
        owners = {id(self._owners[g]): self._owners[g] for g in waiter.chunk if g in self._owners}
        if not owners:
            return True
        if not self.batch_same_service or len(owners) != 1:
            return False
        (group,) = owners.values()
        return group.ready and group.name == waiter.name and group.chunk == waiter.chunk

    def _carry_out(
        self, lease: Lease, group: _Group, placement: Placement, memory_mb: int
    ) -> None:
        started = self._clock()
        if not placement.fits:
            raise ServiceError(
                f"{lease.model} ({memory_mb} MB per GPU) does not fit on GPUs {list(lease.chunk)}"
                " even after evicting every idle resident there"
            )
        for name in placement.evict:
            with contextlib.suppress(ServiceError):
                self.actuator.unload(name)
            lease.evicted.append(name)
        if placement.load:
            try:
                self.actuator.load(lease.name, lease.model, lease.chunk)
            except BaseException:
                self.forget(lease.name)
                raise
            lease.loaded = True
        lease.setup_s = self._clock() - started
        with self._cond:
            group.ready = True
            self._cond.notify_all()

    def _leave(self, group: _Group, name: str) -> None:
        with self._cond:
            group.holders -= 1
            self._touch(name)
            if group.holders == 0:
                for gpu in group.chunk:
                    if self._owners.get(gpu) is group:
                        del self._owners[gpu]
            self._cond.notify_all()

    def _touch(self, name: str) -> None:
        resident = self._residents.get(name)
        if resident is not None:
            self._residents[name] = replace(resident, last_used=next(self._tick))
