"""The GPU pool runtime: what a GPU pool worker does with each reward action.

A reward action (``kind="reward"``, payload ``{"model", "inputs", "pool"?}``, cost ``{"gpu": 1 |
[1, 8] | {"set": [1, 2, 4, 8]}}``) reaches the worker of its pool through ``tangram.gpu.<pool>``.
The worker, like a CPU node:

1. validates the message again and checks it against the model repository (model name, inputs
   against ``config.pbtxt``, GPU counts the model and the pool can serve); anything wrong is a
   ``rejected`` result, and the worker carries on;
2. waits in its admission gate for an aligned power-of-two chunk of GPU ids. By default
   (``TANGRAM_SCHEDULER=robust``) the gate runs the service-aware scheduler
   (:func:`tangram_celery.pools.placement.replica_policy`,
   :mod:`tangram_celery.scheduling.replicas`): it sees which services are resident where
   (:func:`residency_view`) and how long each takes to restore (measured per model and chunk
   size, ``TANGRAM_GPU_RESTORE_S`` until measured), and plans the queue FCFS with cache
   affinity (wait for a busy replica when a restore costs more), replica scaling (restore on
   another chunk when that finishes sooner) and backfilling with a starvation bound. With
   ``TANGRAM_SCHEDULER=elastic`` it runs the paper's ARL-Tangram decision
   (:func:`tangram_celery.pools.placement.elastic_policy`), and among chunks that decision treats as
   equal (same best-fit size) takes the one the GPU manager ranks first: one that already holds
   the model's service, else the fewest evictions (:func:`steer_grants`); with ``fcfs-min``
   every action asks for its minimum only;
3. runs the reward on Triton through :class:`~tangram_celery.reward.executor.RewardExecutor`
   (evict-on-execution: the service is loaded on that chunk if it is not resident there);
   **Cross-request batching** (on unless ``batching=False`` / ``--no-batching``): reward
   actions waiting for the same service are sent together. An arriving action whose service
   (same model, a chunk size the action allows) is running on a chunk *joins* that chunk
   instead of waiting for free GPUs (:func:`join_target`), unless an older action of its model
   waits in the gate; and when the gate grants an action a chunk, the oldest actions of its
   model waiting in the gate join it at once (:func:`gate_joiners`), so each service keeps its
   FCFS order. Triton's dynamic batching merges the concurrent requests. A batch takes at most
   ``max_batch`` joiners over its life (``--max-batch``, default 16), so services waiting for
   those GPUs are not starved; the chunk goes back to the gate when the batch's last member
   finishes. **So at-most-one-action-per-GPU holds per service batch**: the actions of one
   batch share its chunk at once; actions of different services, or of different batches,
   never share a GPU. A joined action's result says ``joined: true``, its ``units`` are the
   shared chunk and its exec time is its own inference;
4. gives the GPUs back whatever happens and returns an :class:`~tangram_celery.action.ActionResult`
   whose ``output`` is the model's outputs (e.g. ``{"reward": 0.93}``) plus how it was served
   (``service``, ``loaded``, ``evicted``, ...). Loading and evicting count as overhead in the ACT.

Expected durations come from the action's ``t1``/``elasticity``, else from an online
:class:`~tangram_celery.scheduling.DurationModel` that learns from every finished action, keyed
``("reward", signature or model)``.

**GPUs on a machine without GPUs are simulated** (``TANGRAM_GPU_SIMULATED``, default true): the
ids are labels, and a chunk of k ids is served by k CPU instances of the model on the real
tritonserver. Run a worker with ``python -m tangram_celery.pools.gpu_pool --pool default --gpus 8``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import redis

from tangram_celery import keys
from tangram_celery.action import Action, ActionResult, Timings, parse_action
from tangram_celery.errors import ConfigError, TangramError, TritonUnavailable, ValidationError
from tangram_celery.keys import DEFAULT_GPU_POOL
from tangram_celery.managers.gpu import Chunk
from tangram_celery.pools.admission import Admission, Grant, Policy, PoolState, Request
from tangram_celery.pools.conversion import action_limits, request_for, signature_of
from tangram_celery.pools.placement import (
    Residency,
    elastic_policy,
    gpu_pool_factory,
    replica_policy,
)
from tangram_celery.pools.serving import Heartbeat, admission_window, rejected_result, serve
from tangram_celery.scheduling import DurationModel, GpuPool, SchedulerConfig
from tangram_celery.scheduling.replicas import ReplicaConfig
from tangram_celery.scheduling.residency import Resident, service_name
from tangram_celery.scheduling.topology import free_chunks
from tangram_celery.scheduling.types import Service
from tangram_celery.settings import Settings

if TYPE_CHECKING:
    from tangram_celery.reward.executor import RewardOutcome
    from tangram_celery.reward.repository import ModelSpec

log = logging.getLogger(__name__)

PAYLOAD_FIELDS = frozenset({"model", "inputs", "pool"})
RESERVED_OUTPUTS = frozenset(
    {"model", "service", "loaded", "evicted", "joined", "gpu_wait_s", "simulated_gpus"}
)
POOL_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
DEFAULT_NODE_SIZE = 8
DEFAULT_TRITON_RETRY_S = 30.0
DEFAULT_MAX_BATCH = 16
RETRY_FIRST_S = 0.2
RETRY_MAX_S = 2.0

Prefer = Callable[[str, Sequence[Chunk]], Chunk]
"""Picks one of several equally good chunks (unit ids) for an action id."""


# --------------------------------------------------------------------------- pure helpers


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


def retry_delays(first: float = RETRY_FIRST_S, most: float = RETRY_MAX_S) -> Iterator[float]:
    """Backoff between attempts while Triton is unavailable: ``first``, doubling, capped at
    ``most``."""
    delay = first
    while True:
        yield delay
        delay = min(delay * 2, most)


def gave_up(exc: TritonUnavailable, retry_s: float) -> TritonUnavailable:
    """The error of an action that waited ``retry_s`` seconds for Triton in vain: names Triton,
    the setting and how to start a server."""
    from tangram_celery.reward.triton import START_HINT

    hint = "" if START_HINT in str(exc) else f"; {START_HINT}"
    return TritonUnavailable(
        f"Triton did not come back within {retry_s:g} s (TANGRAM_TRITON_RETRY_S / "
        f"--triton-retry-s), so this reward action was not run: {exc}{hint}"
    )


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


RESTORE_SMOOTHING = 0.3
"""Weight of a new restore time in a model's running estimate."""


def smoothed(previous: float | None, sample: float, weight: float = RESTORE_SMOOTHING) -> float:
    """An exponentially weighted running estimate: ``sample`` itself when none is known."""
    return sample if previous is None else (1 - weight) * previous + weight * sample


def residency_view(
    executor: RewardBackend, unit_of: Mapping[int, int], node_size: int,
    restore_s: Mapping[tuple[str, int], float], gpu_memory_mb: int,
) -> Residency:
    """The scheduler's view of a pool's residency: ``executor``'s residents moved onto unit
    ids (``unit_of`` maps GPU ids) and named as :func:`service_name` names them there, and
    each model's memory per GPU and measured restore times per chunk size it allows."""
    residents = []
    for resident in executor.loaded():
        units = tuple(sorted(unit_of[gpu] for gpu in resident.chunk if gpu in unit_of))
        if len(units) == len(resident.chunk):
            residents.append(Resident(service_name(resident.model, units), resident.model,
                                      units, resident.memory_mb, resident.last_used))
    services = []
    for model in executor.models():
        spec = executor.spec(model)
        sizes = [d for d in spec.dops if d <= node_size]
        services.append(Service(
            model, tuple((d, spec.memory_mb) for d in sizes),
            tuple((d, restore_s[(model, d)]) for d in sizes if (model, d) in restore_s)))
    return Residency(tuple(residents), tuple(services), gpu_memory_mb)


def reward_inputs(action: Action) -> tuple[str, Mapping[str, Any]]:
    """The model name and inputs of a reward action's payload (unknown fields refused)."""
    extra = sorted(set(action.payload) - PAYLOAD_FIELDS)
    if extra:
        raise ValidationError(
            f"payload.{extra[0]}", f"unknown field; a reward payload has {sorted(PAYLOAD_FIELDS)}"
        )
    inputs = action.payload.get("inputs")
    if not isinstance(inputs, Mapping):
        raise ValidationError("payload.inputs", "an object of input tensor name -> value(s)")
    return str(action.payload["model"]), inputs


def inventory_fields(
    gpus: int, free_gpus: int, worker: str, models: Sequence[str],
    residents: Sequence[tuple[str, Chunk]], now: float,
    decisions: tuple[int, float] = (0, 0.0),
) -> dict[str, str]:
    """The hash a GPU pool publishes about itself (``keys.gpu_pool``), as strings; with its
    scheduler's calls and wall seconds so far."""
    return {
        "gpus": str(gpus),
        "free_gpus": str(free_gpus),
        "heartbeat": repr(now),
        "worker": worker,
        "models": json.dumps(list(models)),
        "residents": json.dumps([{"model": m, "gpus": list(c)} for m, c in residents]),
        "decide_calls": str(decisions[0]),
        "decide_s": repr(decisions[1]),
    }


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


def check_pool_name(pool: str) -> str:
    """``pool`` if it is a valid pool name (1-64 of A-Z a-z 0-9 _ -), else :class:`ConfigError`."""
    if not POOL_PATTERN.fullmatch(pool):
        raise ConfigError(f"GPU pool name {pool!r}: use 1-64 characters of A-Z a-z 0-9 _ -")
    return pool


@dataclass(frozen=True)
class Batch:
    """A service running on a chunk (unit ids): its model, the action that was granted the
    chunk, how many actions joined it so far and how many members still run."""

    model: str
    units: Chunk
    owner: str
    joiners: int = 0
    holders: int = 1


def join_target(
    model: str, sizes: Sequence[int], batches: Sequence[Batch], waiting_models: Iterable[str],
    max_batch: int,
) -> Batch | None:
    """The running batch an arriving action of ``model`` (allowed chunk sizes ``sizes``) joins,
    or None (it waits in the gate): one of ``model`` on a chunk of an allowed size with fewer
    than ``max_batch`` joiners so far, the least joined first; never while an (older) action
    of ``model`` is waiting (``waiting_models``), so a service's actions keep FCFS order."""
    if max_batch < 1 or model in set(waiting_models):
        return None
    open_batches = [b for b in batches
                    if b.model == model and len(b.units) in sizes and b.joiners < max_batch]
    if not open_batches:
        return None
    return min(open_batches, key=lambda b: (b.joiners, b.units))


Waiter = tuple[str, str, Sequence[int]]
"""An action waiting in the gate: its id, model and allowed chunk sizes."""


def gate_joiners(model: str, size: int, waiting: Sequence[Waiter], max_batch: int) -> list[str]:
    """The waiting actions (oldest first) that join a batch of ``model`` just granted a
    ``size``-unit chunk: those of ``model``, in order, at most ``max_batch``, stopping at the
    first of ``model`` that does not allow ``size`` (nothing overtakes it: FCFS per service)."""
    chosen: list[str] = []
    for action_id, waiting_model, sizes in waiting:
        if len(chosen) >= max_batch:
            break
        if waiting_model != model:
            continue
        if size not in sizes:
            break
        chosen.append(action_id)
    return chosen


# --------------------------------------------------------------------------- the runtime


class RewardBackend(Protocol):
    """What the pool needs from its reward executor (:class:`RewardExecutor` in production)."""

    def models(self) -> list[str]:
        """The reward models it can run."""

    def spec(self, model: str) -> ModelSpec:
        """The config-derived spec of ``model``; :class:`ValidationError` if unknown."""

    def ready(self) -> bool:
        """Whether the inference server answers."""

    def residents(self) -> list[tuple[str, Chunk]]:
        """(model, GPU ids) of every resident service."""

    def loaded(self) -> list[Resident]:
        """Every resident service with its memory and last use (chunks of GPU ids)."""

    def rank_chunks(self, model: str, chunks: Sequence[Chunk]) -> list[Chunk]:
        """Candidate chunks (GPU ids) best first for ``model``."""

    def run(self, model: str, inputs: Mapping[str, Any], gpus: tuple[int, ...]) -> RewardOutcome:
        """Score ``inputs`` with ``model`` on the chunk ``gpus``."""

    def close(self, unload: bool = True) -> list[str]:
        """Unload idle residents and close connections."""


class GpuPoolRuntime:
    """One GPU pool worker: its GPUs, admission gate, duration model and reward executor.

    ``gpu_ids`` are the pool's GPU ids in order (simulated labels on a machine without GPUs);
    the gate schedules unit ids ``0..len(gpu_ids)-1`` and unit ``u`` is GPU ``gpu_ids[u]``.
    With a Redis ``client`` the pool publishes its inventory (GPUs, free GPUs, models, resident
    services) under ``keys.gpu_pool(pool)`` every ``TANGRAM_NODE_HEARTBEAT_S`` seconds.

    When Triton does not answer (or was restarted and lost its services) an action is retried
    with backoff while the outage is younger than ``triton_retry_s``; the outage is the pool's,
    so once it has lasted that long every action fails at once with an error naming Triton,
    and the first success ends it.

    With ``batching`` (default) an action may join a running batch of its service (see the
    module docstring and :func:`join_target`), at most ``max_batch`` joiners per batch.
    """

    def __init__(
        self,
        settings: Settings,
        pool: str,
        executor: RewardBackend,
        gpu_ids: Sequence[int],
        node_size: int = DEFAULT_NODE_SIZE,
        durations: DurationModel | None = None,
        name: str = "",
        client: redis.Redis | None = None,
        triton_retry_s: float = DEFAULT_TRITON_RETRY_S,
        batching: bool = True,
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> None:
        if triton_retry_s < 0:
            raise ConfigError(f"--triton-retry-s {triton_retry_s}: use 0 or more seconds")
        if max_batch < 1:
            raise ConfigError(f"--max-batch {max_batch}: use 1 or more joiners per batch")
        self.batching = batching
        self.max_batch = max_batch
        self._batches: dict[Chunk, Batch] = {}
        self.triton_retry_s = triton_retry_s
        self._down_since: float | None = None
        self.settings = settings
        self.pool = check_pool_name(pool)
        self.executor = executor
        self.gpu_ids = tuple(gpu_ids)
        if len(set(self.gpu_ids)) != len(self.gpu_ids):
            raise ConfigError(f"GPU ids repeat in {list(self.gpu_ids)}")
        self.node_size = check_node_size(len(self.gpu_ids), node_size)
        self.durations = durations or DurationModel()
        self.name = name or f"gpu-{pool}"
        self._unit_of = {gpu: unit for unit, gpu in enumerate(self.gpu_ids)}
        self._limits = action_limits(settings)
        self._lock = threading.Lock()
        self._waiting_models: dict[str, tuple[str, Sequence[int]]] = {}
        self._handed: set[str] = set()
        self._redis = client
        self._heartbeat = Heartbeat(f"tangram-gpu-pool-{pool}", settings.node_heartbeat_s,
                                    self.publish)
        check_outputs(executor)
        self._restore_s: dict[tuple[str, int], float] = {}
        self.admission = Admission(range(len(self.gpu_ids)), self._policy())

    def _policy(self) -> Policy:
        """The gate's decision: the service-aware scheduler (``TANGRAM_SCHEDULER=robust``),
        else the paper's allocator steered onto the chunks the GPU manager prefers."""
        if self.settings.scheduler == "robust":
            config = ReplicaConfig(default_restore_s=self.settings.gpu_restore_s)
            return replica_policy(self.pool, gpu_pool_factory(self.pool, self.node_size,
                                                              self.residency), config)
        decision = elastic_policy(self.pool, gpu_pool_factory(self.pool, self.node_size),
                                  SchedulerConfig(depth=self.settings.scheduler_depth))
        return steered_policy(decision, self.node_size, self._prefer)

    def residency(self) -> Residency:
        """What the pool holds now, in unit ids: the manager's residents (named as the
        scheduler names them), every model's memory per GPU at each chunk size it allows,
        and its restore times as measured (unmeasured: ``TANGRAM_GPU_RESTORE_S``)."""
        return residency_view(self.executor, self._unit_of, self.node_size,
                              dict(self._restore_s), self.settings.gpu_memory_mb)

    def start(self) -> None:
        """Publish the pool, start its heartbeat, say whether Triton answers (a worker without
        it still answers every action, with an error result)."""
        if self._redis is not None:
            try:
                self.publish()
            except redis.RedisError:
                log.warning("could not publish GPU pool %s", self.pool, exc_info=True)
            self._heartbeat.start()
        if self.executor.ready():
            log.info("GPU pool %s: Triton is ready", self.pool)
        else:
            log.warning("GPU pool %s: Triton at %s does not answer yet; reward actions get an "
                        "error result until it does", self.pool, self.settings.triton_url)

    def stop(self) -> None:
        """Withdraw the pool's inventory, unload its idle services, close the Triton clients."""
        self._heartbeat.stop()
        with contextlib.suppress(redis.RedisError):
            self.withdraw()
        unloaded = self.executor.close(unload=True)
        log.info("GPU pool %s stopped; unloaded %s", self.pool, unloaded)

    def publish(self) -> None:
        """Write this pool's inventory hash (``keys.gpu_pool``) and list the pool."""
        if self._redis is None:
            return
        fields: dict[Any, Any] = inventory_fields(
            len(self.gpu_ids), self.admission.free_count(), self.name, self.executor.models(),
            self.executor.residents(), time.time(),
            (self.admission.policy_calls, self.admission.policy_s))
        pipe = self._redis.pipeline()
        pipe.sadd(keys.GPU_POOLS, self.pool)
        pipe.hset(keys.gpu_pool(self.pool), mapping=fields)
        pipe.execute()

    def withdraw(self) -> None:
        """Remove this pool's inventory if this worker is the one that published it last."""
        if self._redis is None:
            return
        owner = self._redis.hget(keys.gpu_pool(self.pool), "worker")
        if owner in (self.name, self.name.encode()):
            self._redis.delete(keys.gpu_pool(self.pool))
            self._redis.srem(keys.GPU_POOLS, self.pool)

    def end_trajectory(self, trajectory_id: str) -> None:
        """Nothing to free: reward actions keep no per-trajectory state."""

    def gpus_of(self, units: Sequence[int]) -> tuple[int, ...]:
        """The GPU ids of unit ids."""
        return tuple(self.gpu_ids[u] for u in units)

    def execute(self, message: Mapping[str, Any], received: float) -> dict[str, Any]:
        """Run one action message to completion; never raises for a bad message."""
        try:
            action = parse_action(message, self._limits)
            if action.kind != "reward":
                raise ValidationError("kind", f"{action.kind} actions do not run on GPU pools")
            model, inputs = reward_inputs(action)
            spec = self.executor.spec(model)
            spec.encode(inputs)
            counts = gpu_counts(action.units().allowed_units(), spec.dops, self.node_size)
        except ValidationError as exc:
            return rejected_result(message, str(exc), self.name, received)
        return self._run(action, model, inputs, self.request(action, model, counts, received))

    def request(
        self, action: Action, model: str, counts: Sequence[int], arrived: float
    ) -> Request:
        """The admission request: GPU counts with durations from the action or the model."""
        with self._lock:
            request = request_for(action, arrived, self.durations, counts,
                                  key=action.signature or model)
        if self.settings.scheduler == "fcfs-min":
            request = replace(request, options=request.options[:1])
        return replace(request, service=model)

    def _run(
        self, action: Action, model: str, inputs: Mapping[str, Any], request: Request
    ) -> dict[str, Any]:
        timings = Timings(received=request.arrived)
        result = ActionResult(action.id, action.trajectory_id, action.kind, "error",
                              node=self.name, timings=timings)
        units, joined = self._admit(action.id, model, request)
        timings.admitted = time.time()
        timings.sched_s = self.admission.decision_s(action.id)
        result.units = self.gpus_of(units)
        try:
            outcome = self._serve(model, inputs, result.units)
        except ValidationError as exc:
            result.status, result.error = "rejected", str(exc)
        except TangramError as exc:
            result.error = str(exc)
        else:
            self._finish(action, model, result, outcome, joined)
        finally:
            self._leave(units)
        if result.status != "ok":
            timings.exec_started = timings.exec_finished = time.time()
        timings.stored = time.time()
        return result.to_json()

    def _admit(self, action_id: str, model: str, request: Request) -> tuple[Chunk, bool]:
        """Units for an action and whether it joined a running batch (else the gate granted
        them, and it opens a batch of its own on them)."""
        sizes = [m for m, _ in request.options]
        with self._lock:
            target = join_target(model, sizes, tuple(self._batches.values()),
                                 [m for m, _ in self._waiting_models.values()],
                                 self.max_batch if self.batching else 0)
            if target is not None:
                self._batches[target.units] = replace(
                    target, joiners=target.joiners + 1, holders=target.holders + 1)
                return target.units, True
            self._waiting_models[action_id] = (model, sizes)
        try:
            units = self.admission.acquire(request)
        finally:
            with self._lock:
                self._waiting_models.pop(action_id, None)
        self.admission.postpone(action_id, self.expected_restore_s(model, units))
        with self._lock:
            if action_id in self._handed:
                self._handed.discard(action_id)
                return units, True
            self._batches[units] = self._open_batch(action_id, model, units)
        return units, False

    def expected_restore_s(self, model: str, units: Chunk) -> float:
        """Seconds a run of ``model`` on ``units`` is expected to spend restoring first: 0 if
        the service is resident there, else its measured (or ``TANGRAM_GPU_RESTORE_S``)
        restore time."""
        gpus = self.gpus_of(units)
        if any(r.model == model and r.chunk == gpus for r in self.executor.loaded()):
            return 0.0
        return self._restore_s.get((model, len(units)), self.settings.gpu_restore_s)

    def _open_batch(self, owner: str, model: str, units: Chunk) -> Batch:
        """The batch of an action the gate granted ``units``, with the waiting actions of its
        model that join it at once (woken through the gate). Called holding ``_lock``."""
        if not self.batching:
            return Batch(model, units, owner)
        waiting = [(a, m, s) for a, (m, s) in self._waiting_models.items()]
        pulled = self.admission.hand_over(
            gate_joiners(model, len(units), waiting, self.max_batch), units)
        for action_id in pulled:
            self._waiting_models.pop(action_id, None)
            self._handed.add(action_id)
        return Batch(model, units, owner, joiners=len(pulled), holders=1 + len(pulled))

    def _leave(self, units: Chunk) -> None:
        """One member of the batch on ``units`` is done; the last gives the chunk back."""
        with self._lock:
            batch = self._batches[units]
            if batch.holders > 1:
                self._batches[units] = replace(batch, holders=batch.holders - 1)
                return
            del self._batches[units]
        self.admission.release(batch.owner)

    def _serve(
        self, model: str, inputs: Mapping[str, Any], gpus: tuple[int, ...]
    ) -> RewardOutcome:
        """Run on the executor, retrying while Triton is unavailable (see the class)."""
        delays = retry_delays()
        while True:
            try:
                outcome = self.executor.run(model, inputs, gpus)
            except TritonUnavailable as exc:
                remaining = self._outage_deadline() - time.monotonic()
                if remaining <= 0:
                    raise gave_up(exc, self.triton_retry_s) from None
                log.warning("GPU pool %s: %s; retrying for up to %.1f s more", self.pool, exc,
                            remaining)
                time.sleep(min(next(delays), remaining))
            else:
                self._down_since = None
                return outcome

    def _outage_deadline(self) -> float:
        """When the current Triton outage (started now if none is known) stops being retried."""
        with self._lock:
            if self._down_since is None:
                self._down_since = time.monotonic()
            return self._down_since + self.triton_retry_s

    def _finish(
        self, action: Action, model: str, result: ActionResult, outcome: RewardOutcome,
        joined: bool = False,
    ) -> None:
        timings = result.timings
        result.status = "ok"
        result.output = {
            **outcome.output,
            "model": model,
            "service": outcome.triton_model,
            "loaded": outcome.loaded,
            "evicted": list(outcome.evicted),
            "joined": joined,
            "gpu_wait_s": outcome.wait_s,
            "simulated_gpus": self.settings.gpu_simulated,
        }
        timings.exec_started, timings.exec_finished = outcome.started_at, outcome.finished_at
        timings.exec_s, timings.setup_s = outcome.exec_s, outcome.setup_s
        with self._lock:
            self.durations.observe(signature_of(action, action.signature or model),
                                   len(result.units), outcome.exec_s)
            if outcome.loaded:
                key = (model, len(result.units))
                self._restore_s[key] = smoothed(self._restore_s.get(key), outcome.setup_s)

    def _prefer(self, action_id: str, candidates: Sequence[Chunk]) -> Chunk:
        """Of equally good chunks (unit ids), the one the GPU manager ranks first."""
        waiting = self._waiting_models.get(action_id)
        if waiting is None:
            return candidates[0]
        model = waiting[0]
        try:
            ranked = self.executor.rank_chunks(model, [self.gpus_of(c) for c in candidates])
        except TangramError:
            log.warning("could not rank chunks for %s", action_id, exc_info=True)
            return candidates[0]
        return tuple(self._unit_of[gpu] for gpu in ranked[0])


def check_outputs(executor: RewardBackend) -> None:
    """:class:`ConfigError` if a model's output tensor is named like a field the pool adds."""
    for model in executor.models():
        clash = sorted({t.name for t in executor.spec(model).outputs} & RESERVED_OUTPUTS)
        if clash:
            raise ConfigError(
                f"model {model}: output tensor {clash[0]!r} clashes with a field the GPU pool "
                f"adds to results ({sorted(RESERVED_OUTPUTS)}); rename it in its config.pbtxt"
            )


# --------------------------------------------------------------------------- the worker


def model_repository(settings: Settings) -> Path:
    """``TANGRAM_TRITON_REPOSITORY``; a relative path that does not exist from here is taken
    relative to the source checkout (where ``triton_models/`` lives)."""
    path = settings.triton_repository
    if path.is_absolute() or path.exists():
        return path
    from tangram_celery.reward.executor import default_repository

    return default_repository().parent / path


def worker_name(pool: str, pid: int | None = None, host: str | None = None) -> str:
    """Celery node name of the GPU pool worker running in process ``pid``."""
    return f"gpu-{pool}-{pid or os.getpid()}@{host or socket.gethostname()}"


def build_gpu_pool(
    settings: Settings,
    pool: str,
    gpus: int,
    node_size: int = DEFAULT_NODE_SIZE,
    gpu_ids: Sequence[int] | None = None,
    triton_retry_s: float = DEFAULT_TRITON_RETRY_S,
    batching: bool = True,
    max_batch: int = DEFAULT_MAX_BATCH,
) -> GpuPoolRuntime:
    """A GPU pool runtime over the settings' Triton server and model repository."""
    from tangram_celery.reward.executor import RewardExecutor

    ids = tuple(range(gpus)) if gpu_ids is None else tuple(gpu_ids)
    if len(ids) != gpus:
        raise ConfigError(f"--gpus {gpus} but {len(ids)} GPU ids were given: {list(ids)}")
    executor = RewardExecutor(
        settings.triton_url,
        model_repository(settings),
        gpu_ids=ids,
        gpu_memory_mb=settings.gpu_memory_mb,
        simulate_gpus=settings.gpu_simulated,
        protocol="grpc" if settings.triton_protocol == "grpc" else "http",
        timeout_s=settings.max_timeout_s,
        namespace=check_pool_name(pool),
    )
    return GpuPoolRuntime(settings, pool, executor, ids, node_size, name=worker_name(pool),
                          client=redis.Redis.from_url(settings.redis_url),
                          triton_retry_s=triton_retry_s, batching=batching,
                          max_batch=max_batch)


def run_gpu_worker(
    settings: Settings,
    pool: str,
    gpus: int,
    node_size: int = DEFAULT_NODE_SIZE,
    concurrency: int | None = None,
    loglevel: str = "INFO",
    gpu_ids: Sequence[int] | None = None,
    triton_retry_s: float = DEFAULT_TRITON_RETRY_S,
    batching: bool = True,
    max_batch: int = DEFAULT_MAX_BATCH,
) -> None:
    """Run a GPU pool worker on ``tangram.gpu.<pool>`` in this process until told to stop."""
    runtime = build_gpu_pool(settings, pool, gpus, node_size, gpu_ids, triton_retry_s,
                             batching, max_batch)
    window = admission_window(settings, gpus, concurrency)
    kind = "simulated" if settings.gpu_simulated else "real"
    serve(settings, runtime, keys.gpu_queue(pool), worker_name(pool), window, loglevel,
          f"GPU pool {pool} ready: {gpus} {kind} GPUs (nodes of {runtime.node_size}), "
          f"window {window}, Triton {settings.triton_url} ({settings.triton_protocol}), "
          f"batching {f'up to {max_batch} joiners' if batching else 'off'}")


def parse_gpu_ids(raw: str) -> list[int]:
    """``"4,5,6,7"`` -> ``[4, 5, 6, 7]`` (for ``--gpu-ids``)."""
    try:
        return [int(part) for part in raw.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r}: expected GPU ids such as 4,5,6,7") from None


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a GPU pool worker (``args.gpu_pool``: ``--pool`` must not clash with the
    CLI's own ``pool`` subcommand field)."""
    parser.add_argument("--pool", dest="gpu_pool", default=DEFAULT_GPU_POOL,
                        help="pool name; its queue is tangram.gpu.NAME (default: default)")
    parser.add_argument("--gpus", type=int, required=True,
                        help="GPUs this pool schedules (simulated unless "
                             "TANGRAM_GPU_SIMULATED=false)")
    parser.add_argument("--node-size", type=int, default=DEFAULT_NODE_SIZE,
                        help="GPUs per node; chunks never cross a node (default 8)")
    parser.add_argument("--gpu-ids", type=parse_gpu_ids, default=None,
                        help="the pool's GPU ids, comma separated (default 0..N-1)")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="admission window: messages held at once (default max(2N, N+4))")
    parser.add_argument("--triton-retry-s", type=float, default=None,
                        help="how long an action waits for an unavailable (or restarted) Triton "
                             f"before it fails (default {DEFAULT_TRITON_RETRY_S:g})")
    parser.add_argument("--no-batching", dest="batching", action="store_false",
                        help="give every reward action its own chunk (no joining a running "
                             "batch of its service)")
    parser.add_argument("--max-batch", type=int, default=None,
                        help="actions that may join a running batch of a service on its chunk "
                             f"(default TANGRAM_REWARD_MAX_BATCH, {DEFAULT_MAX_BATCH})")
    parser.add_argument("--loglevel", default="INFO")


def run_from_args(settings: Settings, args: argparse.Namespace) -> None:
    """Run the worker that :func:`add_worker_arguments` options describe."""
    retry = settings.triton_retry_s if args.triton_retry_s is None else args.triton_retry_s
    run_gpu_worker(settings, args.gpu_pool, args.gpus, args.node_size, args.concurrency,
                   args.loglevel, args.gpu_ids, retry, args.batching,
                   settings.reward_max_batch if args.max_batch is None else args.max_batch)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tangram_celery.pools.gpu_pool --gpus N [--pool NAME] [--node-size K] ...``."""
    parser = argparse.ArgumentParser(prog="python -m tangram_celery.pools.gpu_pool",
                                     description="run a GPU reward pool worker")
    add_worker_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    try:
        run_from_args(Settings.from_env(), args)
    except TangramError as exc:
        print(f"tangram: error: {exc}", file=sys.stderr)
        return 2
    return 0


# --------------------------------------------------------------------------- client helper


def reward_action(
    trajectory_id: str,
    model: str,
    inputs: Mapping[str, Any],
    *,
    gpu: int | tuple[int, int] | Mapping[str, Any] = 1,
    pool: str | None = None,
    **fields: Any,
) -> Action:
    """A reward action: score ``inputs`` with ``model`` on ``gpu`` GPUs (a count, a range
    ``(min, max)`` or ``{"set": [1, 2, 4, 8]}``) of GPU pool ``pool`` (default: ``default``)."""
    payload: dict[str, Any] = {"model": model, "inputs": dict(inputs)}
    if pool is not None:
        payload["pool"] = pool
    cost = dict(fields.pop("cost", {}))
    cost.setdefault("gpu", list(gpu) if isinstance(gpu, tuple) else gpu)
    body = {"kind": "reward", "trajectory_id": trajectory_id, "payload": payload, "cost": cost,
            **fields}
    return parse_action(body)


if __name__ == "__main__":
    sys.exit(main())
