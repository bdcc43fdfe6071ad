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

Expected durations come from the action's ``t1``/``elasticity``, else from what the pool
learned per (model, DoP) of the calls it served (:mod:`tangram_celery.scheduling.service_times`,
the CPU nodes' :mod:`~tangram_celery.scheduling.learned` rules; an elastic call of a model
never served is tried at its counts under the prior), shared with the other GPU pools through
Redis (:class:`~tangram_celery.pools.gpu_pool.learning.ServiceTimes`,
``TANGRAM_DURATIONS_SYNC_S``). ``--cache-aware`` runs the pooled baselines' cache-aware FCFS
instead (:func:`~tangram_celery.pools.gpu_pool.policy.gate_policy`).

**GPUs on a machine without GPUs are simulated** (``TANGRAM_GPU_SIMULATED``, default true): the
ids are labels, and a chunk of k ids is served by k CPU instances of the model on the real
tritonserver. Run a worker with ``python -m tangram_celery.pools.gpu_pool --pool default --gpus 8``.
"""

from __future__ import annotations

from tangram_celery.pools.gpu_pool.backend import gave_up, retry_delays
from tangram_celery.pools.gpu_pool.batching import Batch, gate_joiners, join_target
from tangram_celery.pools.gpu_pool.payload import reward_action
from tangram_celery.pools.gpu_pool.policy import best_fit_chunks, gpu_counts, steer_grants
from tangram_celery.pools.gpu_pool.runtime import GpuPoolRuntime
from tangram_celery.pools.gpu_pool.worker import worker_name

__all__ = [
    "Batch",
    "GpuPoolRuntime",
    "best_fit_chunks",
    "gate_joiners",
    "gave_up",
    "gpu_counts",
    "join_target",
    "retry_delays",
    "reward_action",
    "steer_grants",
    "worker_name",
]
