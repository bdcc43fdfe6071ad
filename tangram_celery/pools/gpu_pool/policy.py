"""The GPU pool's gate policy: the GPU counts an action may ask for, the decision, its chunk.

By default (``TANGRAM_SCHEDULER=robust``) the gate runs the service-aware scheduler; otherwise
the paper's allocator, whose grants :func:`steer_grants` moves onto the chunk a :data:`Prefer`
callback (the GPU manager's ranking) picks among those best fit treats as equal. A worker run
``--cache-aware`` (the pooled baselines made cache-aware, as the simulator's ``:cache`` systems)
runs :class:`~tangram_celery.scheduling.affinity.AffinityPolicy` and puts each grant on a free
chunk holding its service (:func:`cache_steered_policy`). Chunks are
aligned power-of-two runs of unit ids inside one node of ``node_size`` GPUs.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from tangram_celery.errors import ConfigError, ValidationError
from tangram_celery.managers.gpu import Chunk
from tangram_celery.pools.admission import Grant, Policy, PoolState
from tangram_celery.pools.placement import (
    Residency,
    elastic_policy,
    gpu_pool_factory,
    replica_policy,
    snapshot_policy,
)
from tangram_celery.scheduling import GpuPool, SchedulerConfig
from tangram_celery.scheduling.affinity import AffinityPolicy, cache_aware_chunks
from tangram_celery.scheduling.replicas import ReplicaConfig
from tangram_celery.scheduling.topology import free_chunks
from tangram_celery.settings import Settings

DEFAULT_NODE_SIZE = 8

Prefer = Callable[[str, Sequence[Chunk]], Chunk]
"""Picks one of several equally good chunks (unit ids) for an action id."""


def gpu_counts(allowed: Sequence[int], dops: Sequence[int], node_size: int) -> tuple[int, ...]:
    """The GPU counts of ``allowed`` that a model (parallelisms ``dops``) can run with on a pool
    of ``node_size``-GPU nodes: powers of two, at most a node. Raises :class:`ValidationError`
    on ``cost.gpu`` when none is left."""
    usable = tuple(m for m in allowed if m in dops and 0 < m <= node_size and not m & (m - 1))
    if not usable:
        served = sorted(d for d in dops if d <= node_size)
        shown = list(allowed[:8]) + (["..."] if len(allowed) > 8 else [])
        raise ValidationError(
            "cost.gpu", f"asks for {shown} GPUs; this pool serves the model on {served} GPUs"
        )
    return usable


def best_fit_chunks(free: Sequence[int], total: int, node_size: int, size: int) -> list[Chunk]:
    """Every aligned ``size``-GPU chunk inside the smallest free aligned chunks that hold
    ``size`` (best fit); taking any of them leaves the same free-chunk sizes. Empty: none fits."""
    chunks = free_chunks(GpuPool("steer", tuple(sorted(free)), total, node_size))
    fitting = [(start, span) for start, span in chunks if span >= size]
    if not fitting:
        return []
    best = min(span for _, span in fitting)
    return [
        tuple(range(start + offset, start + offset + size))
        for start, span in fitting if span == best
        for offset in range(0, span, size)
    ]


def steer_grants(
    grants: Sequence[Grant], free: Sequence[int], total: int, node_size: int, prefer: Prefer
) -> list[Grant]:
    """The same grants (ids and sizes), each on the chunk ``prefer`` picks among the best-fit
    chunks of its size, placed largest first. The multiset of free-chunk sizes evolves as with
    any best-fit placement, so what fits does not change; if anything does not fit the grants
    come back untouched."""
    available = set(free)
    placed: dict[int, Chunk] = {}
    for index in sorted(range(len(grants)), key=lambda i: -len(grants[i][1])):
        action_id, units = grants[index]
        candidates = best_fit_chunks(tuple(available), total, node_size, len(units))
        if not candidates:
            return list(grants)
        choice = prefer(action_id, candidates) if len(candidates) > 1 else candidates[0]
        if choice not in candidates:
            choice = candidates[0]
        available -= set(choice)
        placed[index] = choice
    return [(action_id, placed[i]) for i, (action_id, _) in enumerate(grants)]


def steered_policy(policy: Policy, node_size: int, prefer: Prefer) -> Policy:
    """``policy`` whose grants are moved by :func:`steer_grants` onto preferred chunks."""

    def steered(state: PoolState) -> Sequence[Grant]:
        grants = policy(state)
        if not grants:
            return grants
        return steer_grants(grants, state.free, state.total, min(node_size, state.total), prefer)

    return steered


def cache_steered_policy(policy: Policy, node_size: int,
                         residency: Callable[[], Residency]) -> Policy:
    """``policy`` whose grants go, largest first, onto free chunks where their service is
    resident (:func:`cache_aware_chunks`), the same sizes, so whatever fitted still fits."""

    def steered(state: PoolState) -> Sequence[Grant]:
        grants = policy(state)
        if not grants:
            return grants
        service = {r.id: r.service for r in state.waiting}
        residents = {r.name: r for r in residency().residents}
        chunks = cache_aware_chunks([(service.get(a, ""), units) for a, units in grants],
                                    state.free, state.total, min(node_size, state.total),
                                    residents)
        return [(a, chunk) for (a, _), chunk in zip(grants, chunks, strict=True)]

    return steered


def with_restore_prior(residency: Callable[[], Residency], restore_s: float
                       ) -> Callable[[], Residency]:
    """``residency`` with ``restore_s`` as the restore time of every (service, chunk size) it
    has not measured."""

    def view() -> Residency:
        held = residency()
        services = tuple(
            replace(s, restore_s=tuple(
                (size, restore_s if s.restore_at(size) is None else s.restore_at(size) or 0.0)
                for size, _ in s.memory_mb))
            for s in held.services)
        return replace(held, services=services)

    return view


def gate_policy(
    settings: Settings, pool: str, node_size: int, residency: Callable[[], Residency],
    prefer: Prefer, cache_aware: bool = False,
) -> Policy:
    """The gate's decision: with ``cache_aware`` the pooled baselines' cache-aware FCFS
    (resident first, a miss waits for a busy replica at most its restore time, which is
    ``TANGRAM_GPU_RESTORE_S`` until measured; grants on resident chunks); else the
    service-aware scheduler (``TANGRAM_SCHEDULER=robust``), else the paper's allocator
    steered onto the chunks the GPU manager prefers."""
    if cache_aware:
        view = with_restore_prior(residency, settings.gpu.restore_s)
        affinity = AffinityPolicy(SchedulerConfig(depth=settings.node.scheduler_depth))
        return cache_steered_policy(
            snapshot_policy(pool, gpu_pool_factory(pool, node_size, view), affinity),
            node_size, residency)
    if settings.node.scheduler == "robust":
        config = ReplicaConfig(default_restore_s=settings.gpu.restore_s)
        return replica_policy(pool, gpu_pool_factory(pool, node_size, residency), config)
    decision = elastic_policy(pool, gpu_pool_factory(pool, node_size),
                              SchedulerConfig(depth=settings.node.scheduler_depth))
    return steered_policy(decision, node_size, prefer)


def check_node_size(gpus: int, node_size: int) -> int:
    """The pool's node size (``node_size``, at most ``gpus``); :class:`ConfigError` unless it is
    a power of two that divides ``gpus``."""
    size = min(node_size, gpus)
    if gpus < 1 or size < 1 or size & (size - 1) or gpus % size:
        raise ConfigError(
            f"a GPU pool of {gpus} GPUs cannot be cut into nodes of {node_size}: use a power of "
            "two for --node-size and a multiple of it for --gpus"
        )
    return size
