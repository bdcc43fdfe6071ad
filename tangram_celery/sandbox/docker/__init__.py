"""The Docker sandbox backend: one long-lived container per trajectory, one resident executor in it.

A trajectory's environment is a container made from a local image (see
:mod:`tangram_celery.sandbox.docker.image`), taken from a small warm pool on its first action and
removed by ``end_trajectory`` or after an idle TTL. Its work dir ``/work`` and ``/tmp`` are tmpfs
mounts inside it, so files (and their memory) persist between the trajectory's actions.

Every container gets its resident executor when it is made (in the warm pool, ahead of its
trajectory): one ``docker exec -i`` for the container's whole life, whose socket the node keeps
(:mod:`~tangram_celery.sandbox.docker.link`). Each action, under the trajectory's lock, costs
no Docker API call when the node runs on the engine's host:

1. The node pins the container to the action's cores (``cpuset.cpus`` and a CFS quota of one
   period per distinct core) by writing the container's cgroup files; a node that cannot see
   them (a remote engine, a node in a container) asks the engine with ``container.update``
   (:mod:`~tangram_celery.sandbox.docker.cpu`).
2. The node sends the action over the stream. The resident
   (:mod:`~tangram_celery.sandbox.docker.resident`) kills what earlier actions left, checks that
   the pid cap has room, forks a child that drops to the container's sandbox uid (a host uid
   of the trajectory's own, from the host's uid pool: :mod:`tangram_celery.sandbox.uids`),
   writes the spec's files (never through a symlink) and execs ``/bin/sh -c COMMAND`` with
   ``TANGRAM_UNITS`` set and ``pytest`` made ``pytest -n <units>``
   (:func:`~tangram_celery.sandbox.parallelism.rewrite_parallelism`). It forwards the child's
   output as frames, kills its whole tree at ``timeout_s``, reaps it and reports its wait
   status, OOM kills, elapsed time and work-dir usage, then kills every process of the uid.
   While a malleable test run goes on, the node may re-pin the container to more or fewer
   cores (:meth:`~tangram_celery.sandbox.docker.DockerBackend.repin`) and asks the run to
   grow or shrink through ``docker exec`` (:mod:`~tangram_celery.sandbox.docker.runs`).
3. The node reads the stream with a deadline of ``timeout_s`` plus a grace, so a stuck container
   cannot hang the worker, and throttles the container back to 1% of a core.

Isolation: no network (``network_mode=none``), a pids cap, memory and memory+swap caps, a
read-only root, size-capped tmpfs ``/work``, ``/tmp`` and ``/dev/shm``, every capability dropped
but ``SETUID``, ``SETGID`` and ``SETPCAP``, which only the root-owned init and resident hold: an
action's child empties its bounding set and drops to the sandbox uid, so it holds no capability
at all (``no-new-privileges`` too), a seccomp profile with the embedded backend's deny-list
(ptrace included, plus ``unshare`` and namespace flags of ``clone``), rlimits, and an init
process (``docker-init``) that reaps orphans. Actions cannot signal, trace or read the
descriptors of the init or the resident (another uid, not dumpable).

Memory: the container's cap is ``memory_mb`` plus the work-dir quota, since ``/work`` is tmpfs
(its files are memory); ``/tmp`` and ``/dev/shm`` count against ``memory_mb``.

A container is *broken* when it cannot run an action (gone, paused, pid cap exhausted by
processes the sandbox cannot kill, its resident gone) or stops answering (the deadline
passed). It is thrown away. When that shows before the command started, the action runs once
more in a fresh container; a resident that dies while the command runs answers the action
``sandbox_lost`` (not rerun) and the next action gets a fresh container. The first action in a
fresh container says ``environment_replaced`` with the reason, since the trajectory's files
are gone.

The parts, each importing only those listed before it:

- :mod:`~tangram_celery.sandbox.docker.resident`: the in-container executor (stdlib only)
- :mod:`~tangram_celery.sandbox.docker.policy`: the warm pool's size and idle expiry (pure)
- :mod:`~tangram_celery.sandbox.docker.options`: the container's options, its seccomp profile,
  cpu pinning arguments (pure)
- :mod:`~tangram_celery.sandbox.docker.protocol`: Docker's exec frames, unit counts, exit status
  (pure)
- :mod:`~tangram_celery.sandbox.docker.exchange`: the exec's raw socket
- :mod:`~tangram_celery.sandbox.docker.engine`: connecting, the image, diagnosis
- :mod:`~tangram_celery.sandbox.docker.cpu`: pinning a container's cores (cgroup files or API)
- :mod:`~tangram_celery.sandbox.docker.link`: the node's end of a resident executor
- :mod:`~tangram_celery.sandbox.docker.runs`: reaching a malleable test run in a container
- :mod:`~tangram_celery.sandbox.docker.pool`: every container's life cycle (warm pool,
  trajectories, idle expiry, removal)
- :mod:`~tangram_celery.sandbox.docker.backend`: the backend, its public interface and one
  action
"""

from __future__ import annotations

from tangram_celery.sandbox.docker.backend import DockerBackend, DockerExecOutcome
from tangram_celery.sandbox.docker.policy import WarmPoolPolicy

__all__ = [
    "DockerBackend",
    "DockerExecOutcome",
    "WarmPoolPolicy",
]
