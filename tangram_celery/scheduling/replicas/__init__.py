"""Service-aware GPU scheduling: cache affinity, replica scaling and backfilling (beyond the paper).

On a GPU pool every (model, parallelism) is its own service, and a chunk serves an action
without a restore only if that service is resident on exactly that chunk (see `residency`).
The paper's allocator hands out chunks by size alone, in strict FCFS order: a request for a
whole node blocks everyone behind it, and an action often lands on a chunk where its service
is not loaded, so it pays a restore that a replica freeing up a moment later would have saved.

`decide_replicas` plans one pool's queue in FCFS order, **conservatively**: each job in turn
books the option with the least *cost* among

* **its service's replicas** at an allowed parallelism (cache affinity): a replica runs the job
  when its GPUs are free of running work and of the jobs booked on it before (FCFS per replica),
  with no restore;
* **a restore** of its service onto an aligned chunk of an allowed size (replica scaling): it
  starts when the chunk is free, takes the service's restore time, and unloads the
  least-recently-used residents there that memory requires (`plan_placement`, exactly as the
  GPU manager will; never a service that is running). A chunk whose plan would unload a
  replica an earlier job has booked is not used.

The cost of an option is its expected completion (start + restore + run) plus the *backlog
term*: the GPU-seconds it holds (restore included) times the jobs queued behind it per GPU of
the pool, times `backlog_weight` — each GPU-second one job takes delays the queue behind it by
about that much in all, so under load jobs prefer fewer GPUs and no restore, and with an empty
queue they take the fastest option. A restore that unloads a service that later jobs of the
queue ask for also pays that service's restore time.

**Load-aware DoP cap** (`ReplicaPolicy`, `gpu_cap`): from a forecast of the pool's demand and
the jobs already queued, jobs may take at most the chunk size with the least predicted mean
ACT, so a pool that restored large replicas at light load moves to small ones, the most
throughput per GPU, when a burst comes.

Jobs whose booking starts now start. A later job may start now only on GPUs that no earlier
booking needs before it is expected to finish (**backfilling**), so with right estimates
nothing overtakes a job and delays it; a running job past its expected finish counts as ending
any moment, so nothing backfills in front of it. **Starvation bound:** a job that has waited
`max_bypass_s` is *overdue*: no later job may start on the GPUs of its booking at all, so it
starts as soon as the work running there ends, whatever the estimates.

Pure: plain data in (`Snapshot` whose GPU pools carry residents and services, jobs naming their
`service`, running jobs their GPU ids), a `Decision` out. Pools that are not GPU pools are
left to the paper's allocator (`ersa.settle`).
"""

from __future__ import annotations

from tangram_celery.scheduling.replicas.board import aligned_chunks
from tangram_celery.scheduling.replicas.config import ReplicaConfig
from tangram_celery.scheduling.replicas.planner import Planner
from tangram_celery.scheduling.replicas.policy import ReplicaPolicy, decide_replicas, gpu_cap

__all__ = [
    "Planner",
    "ReplicaConfig",
    "ReplicaPolicy",
    "aligned_chunks",
    "decide_replicas",
    "gpu_cap",
]
