"""The CPU pool runtime: what a CPU node worker does with each sandboxed action.

A node validates each message again, waits in its admission gate for exclusive cores, runs the
action in its trajectory's sandbox pinned to exactly those cores, and gives the cores back when
the process exits (:class:`CpuNode`). Short actions may borrow a core of a running action while
they wait (:class:`CoreLoans`), and every node learns expected durations from the actions that
all nodes finish (:class:`SharedDurations`). :func:`run_cpu_worker` starts a node as a Celery
worker (``tangram worker cpu``).
"""

from __future__ import annotations

from tangram_celery.pools.cpu_pool.node import CpuNode
from tangram_celery.pools.cpu_pool.worker import run_cpu_worker

__all__ = ["CpuNode", "run_cpu_worker"]
