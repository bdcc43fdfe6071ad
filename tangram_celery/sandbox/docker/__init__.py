"""The Docker sandbox backend: one long-lived container per trajectory, one exec per action.

A trajectory's environment is a container made from a local image (see
:mod:`tangram_celery.sandbox.image`), taken from a small warm pool on its first action and
removed by ``end_trajectory`` or after an idle TTL. Its work dir ``/work`` and ``/tmp`` are tmpfs
mounts inside it, so files (and their memory) persist between the trajectory's actions.

Each action, under the trajectory's lock:

1. ``container.update`` pins the container to the action's cores (cpuset, and a CFS quota of one
   period per distinct core); when the exec is over a background task throttles the container
   back to 1% of a core, so nothing a finished action left behind can use the cores that went
   back to the pool.
2. One ``exec`` (the SDK's ``exec_create``/``exec_start`` pair that ``exec_run`` wraps; used
   directly for stdin, a socket deadline and streaming output caps) runs a small ``/bin/sh``
   wrapper as the unprivileged sandbox uid. The wrapper SIGKILLs what earlier actions left
   (``kill -9 -1``), checks that the pid cap has room, writes the spec's files (a Python
   receiver that never follows symlinks), runs ``timeout -s KILL <t> /bin/sh -c COMMAND``, kills
   everything the command left, and reports exit status, OOM kills, elapsed time and work-dir
   usage in a trailer on stderr. ``TANGRAM_UNITS`` is set and ``pytest`` becomes
   ``pytest -n <units>`` (:func:`~tangram_celery.sandbox.parallelism.rewrite_parallelism`).
3. The client reads the exec's socket with a deadline of ``timeout_s`` plus a grace, so a stuck
   engine cannot hang the worker.

Isolation: no network (``network_mode=none``), a pids cap, memory and memory+swap caps, a
read-only root, size-capped tmpfs ``/work``, ``/tmp`` and ``/dev/shm``, every capability dropped,
``no-new-privileges``, a seccomp profile with the embedded backend's deny-list (plus ``unshare``
and namespace flags of ``clone``), rlimits, and an init process (``docker-init``) that reaps
orphans and runs as a uid other than the sandbox's, so the sandbox cannot signal it.

Memory: the container's cap is ``memory_mb`` plus the work-dir quota, since ``/work`` is tmpfs
(its files are memory); ``/tmp`` and ``/dev/shm`` count against ``memory_mb``.

A container is *broken* when it cannot run the wrapper (gone, paused, pid cap exhausted by
processes the sandbox cannot kill) or stops answering (the client deadline passed, the reset
after an action failed). It is thrown away. When that shows before the command started, the
action runs once more in a fresh container; otherwise the next action gets one. The first
action in the fresh container says ``environment_replaced`` with the reason, since the
trajectory's files are gone.

The parts, each importing only those listed before it:

- :mod:`~tangram_celery.sandbox.docker.policy`: the warm pool's size and idle expiry (pure)
- :mod:`~tangram_celery.sandbox.docker.options`: the container's options, its seccomp profile,
  cpu pinning (pure)
- :mod:`~tangram_celery.sandbox.docker.protocol`: the wrapper and file receiver, their markers
  and trailer, frame demultiplexing, exit status (pure)
- :mod:`~tangram_celery.sandbox.docker.exchange`: the exec's socket traffic
- :mod:`~tangram_celery.sandbox.docker.engine`: connecting, the image, exit codes, diagnosis
- :mod:`~tangram_celery.sandbox.docker.pool`: every container's life cycle (warm pool,
  trajectories, idle expiry, removal)
- :mod:`~tangram_celery.sandbox.docker.backend`: the backend, its public interface and one
  action's exec
"""

from __future__ import annotations

from tangram_celery.sandbox.docker.backend import DockerBackend, DockerExecOutcome
from tangram_celery.sandbox.docker.engine import DEFAULT_DOCKER_URL
from tangram_celery.sandbox.docker.options import IDLE_CPU_QUOTA_US
from tangram_celery.sandbox.docker.policy import WarmPoolPolicy
from tangram_celery.sandbox.docker.pool import LABEL_HOST, LABEL_OWNER, OWNER_PREFIX

__all__ = [
    "DEFAULT_DOCKER_URL",
    "IDLE_CPU_QUOTA_US",
    "LABEL_HOST",
    "LABEL_OWNER",
    "OWNER_PREFIX",
    "DockerBackend",
    "DockerExecOutcome",
    "WarmPoolPolicy",
]
