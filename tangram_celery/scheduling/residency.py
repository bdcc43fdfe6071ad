"""Which services are resident on which GPU chunks, and what loading one more would evict (pure).

Every (model, parallelism) pair is its own service, and every placement of it on a chunk of
aligned GPU ids is its own resident, named by :func:`service_name`. A GPU holds several
residents while their memory fits; :func:`plan_placement` says which least-recently-used
residents overlapping a chunk must be unloaded before a service fits there. The GPU manager
(:mod:`tangram_celery.managers.gpu`) carries these plans out on Triton, the service-aware GPU
scheduler (:mod:`tangram_celery.scheduling.replicas`) plans with them, and the simulator keeps
its residency with them, so the three agree by construction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

Chunk = tuple[int, ...]


@dataclass(frozen=True)
class Resident:
    """One service loaded on one chunk: ``memory_mb`` on each of its GPUs."""

    name: str
    model: str
    chunk: Chunk
    memory_mb: int
    last_used: int


@dataclass(frozen=True)
class Placement:
    """The decision for one request: run ``name``; load it first; unload ``evict`` before."""

    name: str
    load: bool
    evict: tuple[str, ...]
    fits: bool = True


def service_name(model: str, chunk: Chunk, namespace: str = "") -> str:
    """The Triton model name of ``model`` placed on ``chunk`` (parallelism = its length),
    prefixed ``<namespace>__`` when a namespace is given."""
    prefix = f"{namespace}__" if namespace else ""
    return f"{prefix}{model}__dop{len(chunk)}__g{chunk[0]}"


def overlaps(a: Iterable[int], b: Iterable[int]) -> bool:
    """Whether two chunks share a GPU."""
    return not set(a).isdisjoint(b)


def memory_used(residents: Iterable[Resident]) -> dict[int, int]:
    """Memory (MB) held on each GPU by ``residents``."""
    used: dict[int, int] = {}
    for resident in residents:
        for gpu in resident.chunk:
            used[gpu] = used.get(gpu, 0) + resident.memory_mb
    return used


def plan_placement(
    residents: Mapping[str, Resident],
    model: str,
    chunk: Chunk,
    memory_mb: int,
    gpu_memory_mb: int,
    pinned: frozenset[str] = frozenset(),
    namespace: str = "",
) -> Placement:
    """Where to run ``model`` on ``chunk``, and which residents to unload first.

    Resident there: run it, nothing else. Otherwise evict the least-recently-used residents that
    overlap the chunk (never a ``pinned`` one) until ``memory_mb`` fits on each of its GPUs.
    ``fits`` is False when even that cannot make room. ``namespace``: see :func:`service_name`.
    """
    name = service_name(model, chunk, namespace)
    if name in residents:
        return Placement(name, load=False, evict=())
    used = memory_used(residents.values())
    short = {gpu: used.get(gpu, 0) + memory_mb - gpu_memory_mb for gpu in chunk}
    candidates = sorted(
        (r for r in residents.values() if overlaps(r.chunk, chunk) and r.name not in pinned),
        key=lambda r: (r.last_used, r.name),
    )
    evict: list[str] = []
    for resident in candidates:
        if all(s <= 0 for s in short.values()):
            break
        if any(short.get(gpu, 0) > 0 for gpu in resident.chunk):
            evict.append(resident.name)
            for gpu in resident.chunk:
                if gpu in short:
                    short[gpu] -= resident.memory_mb
    fits = memory_mb <= gpu_memory_mb and all(s <= 0 for s in short.values())
    return Placement(name, load=True, evict=tuple(evict), fits=fits)


