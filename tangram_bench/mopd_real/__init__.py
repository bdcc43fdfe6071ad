"""The MOPD-like workload on the real stack: teachers on pooled GPUs against static services.

    tangram bench mopd --mode real [--batch 48] [--gpus 24] [--time-scale 1] [--think-scale 0.1]
    (systems: tangram, tangram:ersa, celery, celery:cache, fixed-dop-4:cache, static; the same
    workload simulated beside it)

What is real: Redis, the Celery GPU pool worker processes (their admission gate and scheduler,
the GPU manager's evict-on-execution placement, its memory bookkeeping), the ``tritonserver``
binary of nvidia-pytriton loading and unloading every (teacher, chunk) service through its
repository API, and every request going through Triton. What is emulated: the GPUs (simulated
ids, 80 GB each for the manager's bookkeeping, as in the simulator) and the work on them, by
time: each teacher is :mod:`tangram_bench.teachers.model`, whose load sleeps the restore
time of the chunk it was really placed on and whose requests sleep their Amdahl time on that
chunk (the simulator's formulas), so a request's duration depends on the chunk the scheduler
gave it.

The workload is the simulator's MOPD generator (:func:`~tangram_bench.workloads.mopd`)
with fewer samples per step (48, not 512), every duration multiplied by ``time_scale`` (think
times, one-GPU times, the restore physics) and the LLM's generation (think) times by
``think_scale`` on top: a tenth of the samples arriving in a tenth of the time offers the
teachers about the calls per second of the 512-sample step, and a run of one system takes
about two minutes. The GPU side stays at full length by default (``time_scale`` 1) because
the real stack's own costs do not shrink with it: a load starts one python-backend stub
process per simulated GPU of the chunk, 1-5 s for a chunk of 8 on this 2-core machine, which
would dwarf restores scaled down to 0.5-2 s. All figures are wall seconds of the run. Each
system gets a fresh Redis and a fresh Triton:

* ``tangram``: one pool of ``gpus`` GPUs (nodes of 8), ``TANGRAM_SCHEDULER`` at its default
  (``robust``: the service-aware scheduler), every call elastic over its teacher's parallelisms
  (planned with what the pool learned of each teacher per DoP, unless ``--durations oracle``);
* ``tangram:ersa``: the same pool with the paper's allocator (``TANGRAM_SCHEDULER=elastic``);
* ``celery``: the same pool, ``TANGRAM_SCHEDULER=fcfs-min``: every call at its minimum, FIFO;
* ``celery:cache``, ``fixed-dop-4:cache``: the pooled baselines made cache-aware, as the
  simulator's ``:cache`` systems: the same pool run ``--cache-aware`` (resident-first FCFS with
  a wait for a busy replica bounded by its restore time, grants on chunks holding the service:
  :mod:`tangram_celery.scheduling.affinity`), every call at its minimum, or at the largest of
  its teacher's parallelisms up to 4;
* ``static``: every teacher owns fixed replicas at its smallest parallelism, laid out as the
  simulator lays them out (:func:`~tangram_bench.sim.services.replica_chunks`): one GPU
  pool worker per teacher on exactly those GPU ids, each replica loaded before the timed run.

Every pool runs with cross-request batching off (``--no-batching``): the simulator models
none, and the comparison is with the simulator.

The parts: the configuration and presets (:mod:`.config`), what the runs measured
(:mod:`.measured`), what a run submits and reads back (:mod:`.actions`), the real stack
(:mod:`.stack`), the run driver (:mod:`.run`), the report section (:mod:`.report`);
``python -m tangram_bench.mopd_real`` runs ``tangram bench mopd --mode real``.
"""

from __future__ import annotations

from tangram_bench.mopd_real.actions import (
    layout,
    parallel_fractions,
    pool_name,
    real_workload,
    scale_workload,
    scheduler_for,
    teacher_action,
)
from tangram_bench.mopd_real.config import RealGpuConfig
from tangram_bench.mopd_real.measured import RealGpuRun, RestoreFit, restore_fit
from tangram_bench.mopd_real.report import parts_table, report_notes, setup_text
from tangram_bench.mopd_real.run import run_real
from tangram_bench.mopd_real.stack import TritonCrashed, Watch

__all__ = [
    "RealGpuConfig",
    "RealGpuRun",
    "RestoreFit",
    "TritonCrashed",
    "Watch",
    "layout",
    "parallel_fractions",
    "parts_table",
    "pool_name",
    "real_workload",
    "report_notes",
    "restore_fit",
    "run_real",
    "scale_workload",
    "scheduler_for",
    "setup_text",
    "teacher_action",
]
