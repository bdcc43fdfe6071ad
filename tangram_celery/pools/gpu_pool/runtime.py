"""The GPU pool runtime: one worker's GPUs, gate, batches, Triton calls and published inventory.

What it does with each reward action is described in :mod:`tangram_celery.pools.gpu_pool`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import redis

from tangram_celery import keys
from tangram_celery.action import Action, ActionResult, Timings, parse_action
from tangram_celery.connection import DURABILITY
from tangram_celery.errors import (
    AlreadyAnswered,
    ConfigError,
    TangramError,
    TritonUnavailable,
    ValidationError,
)
from tangram_celery.managers.gpu import Chunk
from tangram_celery.pools.admission import Admission, Request
from tangram_celery.pools.conversion import action_limits, request_for
from tangram_celery.pools.duration_sharing import SharedDurations
from tangram_celery.pools.fence import Fence
from tangram_celery.pools.gpu_pool.backend import (
    DEFAULT_TRITON_RETRY_S,
    RewardBackend,
    check_outputs,
    gave_up,
    residency_view,
    retry_delays,
    smoothed,
)
from tangram_celery.pools.gpu_pool.batching import (
    DEFAULT_MAX_BATCH,
    Batch,
    gate_joiners,
    join_target,
)
from tangram_celery.pools.gpu_pool.inventory import check_pool_name, inventory_fields
from tangram_celery.pools.gpu_pool.learning import ServiceTimes
from tangram_celery.pools.gpu_pool.payload import reward_inputs
from tangram_celery.pools.gpu_pool.policy import (
    DEFAULT_NODE_SIZE,
    check_node_size,
    gate_policy,
    gpu_counts,
)
from tangram_celery.pools.placement import Residency
from tangram_celery.pools.serving import Heartbeat, rejected_result
from tangram_celery.scheduling import DurationModel
from tangram_celery.settings import Settings
from tangram_celery.tasks.clock import broker_time
from tangram_celery.tasks.ledger import Ledger

if TYPE_CHECKING:
    from tangram_celery.reward.executor import RewardOutcome

log = logging.getLogger(__name__)


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

    With ``batching`` (default) an action may join a running batch of its service (see
    :mod:`tangram_celery.pools.gpu_pool` and :func:`join_target`), at most ``max_batch`` joiners
    per batch.

    Service times are learned per (model, DoP) from the calls served, with ``shared`` also from
    the other GPU pools' (:class:`ServiceTimes`); ``cache_aware``: see
    :func:`~tangram_celery.pools.gpu_pool.policy.gate_policy`.
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
        shared: SharedDurations | None = None,
        cache_aware: bool = False,
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
        self.learned = ServiceTimes(pool, durations, shared)
        self.durations = self.learned.model
        self.name = name or f"gpu-{pool}"
        self._unit_of = {gpu: unit for unit, gpu in enumerate(self.gpu_ids)}
        self._limits = action_limits(settings)
        self._lock = threading.Lock()
        self._waiting_models: dict[str, tuple[str, Sequence[int]]] = {}
        self._handed: set[str] = set()
        self._redis = client
        self._heartbeat = Heartbeat(f"tangram-gpu-pool-{pool}", settings.node.heartbeat_s,
                                    self._beat)
        self.fence = Fence(f"GPU pool {pool}", settings.node.ttl_s, None if client is None
                           else Ledger(client, settings.broker.result_ttl_s).stored)
        check_outputs(executor)
        self._restore_s: dict[tuple[str, int], float] = {}
        self.admission = Admission(range(len(self.gpu_ids)), gate_policy(
            settings, self.pool, self.node_size, self.residency, self._prefer, cache_aware))

    def residency(self) -> Residency:
        """What the pool holds now, in unit ids: the manager's residents (named as the
        scheduler names them), every model's memory per GPU at each chunk size it allows,
        and its restore times as measured (unmeasured: ``TANGRAM_GPU_RESTORE_S``)."""
        return residency_view(self.executor, self._unit_of, self.node_size,
                              dict(self._restore_s), self.settings.gpu.memory_mb)

    def start(self) -> None:
        """Publish the pool, start its heartbeat, say whether Triton answers (a worker without
        it still answers every action, with an error result)."""
        if self._redis is not None:
            try:
                self.publish()
            except redis.RedisError:
                log.warning("could not publish GPU pool %s", self.pool, exc_info=True)
            self.fence.start()
            self._heartbeat.start()
        self.learned.start()
        if self.executor.ready():
            log.info("GPU pool %s: Triton is ready", self.pool)
        else:
            log.warning("GPU pool %s: Triton at %s does not answer yet; reward actions get an "
                        "error result until it does", self.pool, self.settings.triton.url)

    def stop(self) -> None:
        """Withdraw the pool's inventory, unload its idle services, close the Triton clients."""
        self._heartbeat.stop()
        self.learned.stop()
        self.fence.stop()
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
            self.executor.residents(), broker_time(self._redis),
            (self.admission.policy_calls, self.admission.policy_s))
        durable = DURABILITY.snapshot()
        if durable:
            fields["durable"] = json.dumps(durable)
        pipe = self._redis.pipeline()
        pipe.sadd(keys.GPU_POOLS, self.pool)
        pipe.hset(keys.gpu_pool(self.pool), mapping=fields)
        pipe.execute()

    def _beat(self) -> None:
        self.fence.beat(self.publish, self.publish)

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
        """The admission request: GPU counts with the durations the action states, else
        those the pool learned (:func:`service_options`)."""
        if action.t1 is not None:
            request = request_for(action, arrived, None, counts)
        else:
            options = self.learned.options(model, action.signature, counts,
                                           action.elasticity is not None)
            request = Request(action.id, options, arrived, action.signature)
        if self.settings.node.scheduler == "fcfs-min":
            request = replace(request, options=request.options[:1])
        return replace(request, service=model)

    def _run(
        self, action: Action, model: str, inputs: Mapping[str, Any], request: Request
    ) -> dict[str, Any]:
        timings = Timings(received=request.arrived)
        result = ActionResult(action.id, action.trajectory_id, action.kind, "error",
                              node=self.name, timings=timings)
        mark = self.fence.mark()
        units, joined = self._admit(action.id, model, request)
        timings.admitted = time.time()
        timings.sched_s = self.admission.decision_s(action.id)
        result.units = self.gpus_of(units)
        try:
            self.fence.enter(action.id, mark)
            outcome = self._serve(model, inputs, result.units)
        except ValidationError as exc:
            result.status, result.error = "rejected", str(exc)
        except AlreadyAnswered:
            raise
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
        return self._restore_s.get((model, len(units)), self.settings.gpu.restore_s)

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
            "simulated_gpus": self.settings.gpu.simulated,
        }
        timings.exec_started, timings.exec_finished = outcome.started_at, outcome.finished_at
        timings.exec_s, timings.setup_s = outcome.exec_s, outcome.setup_s
        self.learned.learn(model, action.signature, len(result.units), outcome.exec_s)
        with self._lock:
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
