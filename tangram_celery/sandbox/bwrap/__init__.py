"""The embedded sandbox backend: bubblewrap, started as an unprivileged uid, one per trajectory.

Each action runs in a fresh bubblewrap sandbox (about 10 ms to start): new user, pid, net, ipc,
uts and cgroup namespaces (no network at all, loopback included), nested user namespaces refused,
no capabilities, a read-only root with read-only ``/usr`` and a short allow-list of ``/etc``,
sized tmpfs ``/tmp`` and ``/dev/shm``, a clean environment, a seccomp deny-list, and the
trajectory's work dir bound read-write at ``/work``. The work dir lives on the host under the
backend's root and persists between the trajectory's actions.

The launch chain, all exec'd in one child process started with ``env -i`` semantics, all fds
closed and the trajectory's own uid (the worker itself runs as root)::

    sh (joins the action's cgroups) -> prlimit (rlimits) -> [taskset] -> bwrap -> sh -> COMMAND

Each live trajectory gets its own host uid from a pool (``uid_base .. uid_base+uid_count-1``), so
RLIMIT_NPROC and file ownership never mix trajectories. Per action, a cgroup v1 group per writable
controller caps memory and pids and pins the cpuset to the allocated cores (CPU affinity via
``taskset`` where cpuset is not writable). The wall-clock timeout SIGKILLs bubblewrap, whose death
takes down the sandbox's pid namespace (``--die-with-parent``), and then every pid left in the
cgroups. :meth:`BwrapBackend.repin` moves a running action onto other cores (its cpuset), which
is how a node lends a core of a running action to a short one (core loans,
:mod:`tangram_celery.scheduling.loans`).

The parts: :mod:`~tangram_celery.sandbox.bwrap.backend` (the backend: trajectories, work
dirs, uids), :mod:`~tangram_celery.sandbox.bwrap.action` (one action: cgroups, spawn,
wait, kill, reap), :mod:`~tangram_celery.sandbox.bwrap.launch` (the launch chain's argv:
rlimits, mounts, namespaces), :mod:`~tangram_celery.sandbox.bwrap.uids` (the uid pool) and
:mod:`~tangram_celery.sandbox.bwrap.trajectory` (a live trajectory's state).
"""

from __future__ import annotations

from tangram_celery.sandbox.bwrap.backend import BwrapBackend
from tangram_celery.sandbox.bwrap.uids import UidPool, kill_uid

__all__ = ["BwrapBackend", "UidPool", "kill_uid"]
