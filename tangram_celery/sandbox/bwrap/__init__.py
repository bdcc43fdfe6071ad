"""The embedded sandbox backend: bubblewrap, started as an unprivileged uid, one per trajectory.

Each trajectory's sandbox is one bubblewrap process that lives across its actions: new user, pid,
net, ipc, uts and cgroup namespaces (no network at all, loopback included), nested user
namespaces refused, no capabilities, a read-only root with read-only ``/usr`` and a short
allow-list of ``/etc``, sized tmpfs ``/tmp`` and ``/dev/shm``, a clean environment, a seccomp
deny-list, rlimits, and the trajectory's work dir bound read-write at ``/work``. The work dir lives
on the host under the backend's root and persists between the trajectory's actions.

Inside runs a **warm executor** (:mod:`tangram_celery.sandbox.bwrap.executor`) as the sandbox's
pid 1, started with the sandbox (or ahead of it, in a ready sandbox) and reached only through a
socketpair the node made. The sandbox lives in the trajectory's own cgroups (memory, pids,
cpuset): per action the node sets their cpuset to the action's exclusive cores and the executor
forks a child, born in them (a second action running at the same time gets groups of its own
and the node moves its child there; CPU affinity where cpuset is not writable), all before the
child runs user code; the node reads its output from pipes only the node holds and its exit
status from the executor's ``waitpid``. At exit or at the wall-clock timeout every process the
action left is SIGKILLed. An action cannot signal or trace the executor (pid 1 of its namespace,
not dumpable, ``ptrace`` refused by seccomp). When the executor dies under an action, the action
raises :class:`~tangram_celery.errors.SandboxLostError` (``sandbox_lost``; not rerun) and the
next action starts a fresh executor on the same work dir.

Each live trajectory gets its own host uid from a pool (``uid_base .. uid_base+uid_count-1``), so
RLIMIT_NPROC and file ownership never mix trajectories. :meth:`BwrapBackend.repin` moves a
running action onto other cores (its cpuset), which is how a node lends a core of a running
action to a short one (core loans, :mod:`tangram_celery.scheduling.lending`).

The parts: :mod:`~tangram_celery.sandbox.bwrap.backend` (the backend: trajectories, work
dirs, uids), :mod:`~tangram_celery.sandbox.bwrap.action` (one action: cgroups, placement,
output, exit, kill), :mod:`~tangram_celery.sandbox.bwrap.housing` (the trajectory's own
cgroups), :mod:`~tangram_celery.sandbox.bwrap.warm` (the node's side of an
executor), :mod:`~tangram_celery.sandbox.bwrap.ready` (sandboxes started ahead),
:mod:`~tangram_celery.sandbox.bwrap.launch` (the sandbox's argv: rlimits, mounts, namespaces),
:mod:`~tangram_celery.sandbox.uids` (the uid pool) and
:mod:`~tangram_celery.sandbox.bwrap.trajectory` (a live trajectory's state).
"""

from __future__ import annotations

from tangram_celery.sandbox.bwrap.backend import BwrapBackend

__all__ = [
    "BwrapBackend",
]
