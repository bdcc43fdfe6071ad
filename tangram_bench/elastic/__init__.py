"""The AI-coding workload on the real stack: tangram vs fixed DoP vs plain FIFO, side by side.

    python -m tangram_bench.elastic [--batch 8] [--cores 8] [--seed 1]
    (the same as: tangram bench coding --mode real
     --systems tangram,tangram:ersa,fixed-dop-4,fcfs-min,celery,tangram:malleable,
     tangram:malleable-fixed)

One CPU node worker (real Celery, Redis, bubblewrap sandboxes, audited core allocations) runs
the same seeded AI-coding batch (the simulator's generator at a smaller scale, see
:data:`REAL_PARAMS`) once per system:

* ``tangram``: the default ``TANGRAM_SCHEDULER`` (robust), test runs elastic over 1..cores;
* ``tangram:ersa``: the paper's allocator (``TANGRAM_SCHEDULER=elastic``), the same actions;
* ``fixed-dop-<k>``: the same scheduler, every test run declaring exactly ``min(k, cores)``
  cores (a single-option job is admitted FCFS at that count: the fixed-DoP baseline, no
  node-side policy needed);
* ``fcfs-min``: tangram's node with ``TANGRAM_SCHEDULER=fcfs-min``, every action at one core,
  strict FIFO;
* ``tangram:malleable``: the default scheduler on a node that resizes running test runs
  (``TANGRAM_MALLEABLE_RESIZE=1``); its test runs are malleable pytest runs of a generated suite
  (:func:`tangram_bench.emulation.emulated_malleable_run`), so cores can join and leave them;
* ``tangram:malleable-fixed``: its control, the same malleable runs on a node that does not
  resize them (each keeps the cores it was admitted with);
* ``celery``: a stock Celery worker (prefork, one process per core) running each action's
  command in a plain subprocess, no tangram code in its path (:mod:`.stock`).

Test runs emulate their work by sleeping T1/S(m) for the m cores they really got (see
:mod:`tangram_bench.emulation`; ``tangram:malleable``'s sleep a share of T1 per test); exec
actions sleep their duration on one core. No action declares its duration: tangram's node
learns them by signature.

What each system submits is in :mod:`.actions`, the run in :mod:`.run`.
"""

from __future__ import annotations

from tangram_bench.elastic.actions import real_workload, scheduler_for
from tangram_bench.elastic.run import run_real

__all__ = [
    "real_workload",
    "run_real",
    "scheduler_for",
]
