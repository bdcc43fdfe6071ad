"""A trajectory's own cgroups: its sandbox lives in them, so its actions' children are born there.

On cgroup v1 moving a process into a group (a ``cgroup.procs`` write) waits for an RCU grace
period when the hierarchy was idle: about 6-8 ms on our machines, against 0.06 ms right after
another move. Writing a group's ``cpuset.cpus`` costs 0.05-0.25 ms. So the node moves the sandbox
(bubblewrap and the warm executor) into the trajectory's groups once, when it starts (for a
ready sandbox, ahead of its trajectory), and an action that runs alone in its trajectory only
sets the group's cpuset: its child is born in the groups with their limits and its cores. A
second action running at the same time gets groups of its own, as before.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from tangram_celery.sandbox.base import SandboxLimits
from tangram_celery.sandbox.bwrap.trajectory import Trajectory
from tangram_celery.sandbox.cgroups import CgroupLimits, Hierarchy

log = logging.getLogger(__name__)
SANDBOX_PIDS = 2
"""Processes of the sandbox itself in the trajectory's pids group: bubblewrap and the executor."""


def sandbox_pids(pid: int) -> set[int]:
    """``pid`` and all its descendants (read from ``/proc/PID/task/TID/children``)."""
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        if current in found:
            continue
        found.add(current)
        with contextlib.suppress(OSError, ValueError):
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
    return found


def house(cgroups: Hierarchy | None, limits: SandboxLimits, memory_bytes: int,
          traj: Trajectory, pid: int) -> None:
    """Move the sandbox whose bubblewrap is ``pid`` into ``traj``'s own groups (made on first
    use, ``memory_bytes`` the memory they allow). On failure the trajectory has none, and its
    actions use groups of their own."""
    if cgroups is None:
        return
    try:
        if traj.group is None:
            traj.group = cgroups.create(
                CgroupLimits(memory_bytes, limits.pids + SANDBOX_PIDS, ()),
                traj.uid, traj.uid, prefix="t")
        if traj.group is None:
            return
        pids = sandbox_pids(pid)
        traj.group.join(pids)
        traj.group.spare = frozenset(pids)
    except OSError as exc:
        log.warning("trajectory %s: its sandbox stays out of cgroups of its own (%s); its "
                    "actions get groups each", traj.trajectory_id, exc)
        unhouse(traj)


def unhouse(traj: Trajectory) -> None:
    """Remove the trajectory's own groups (killing what is left in them)."""
    group, traj.group = traj.group, None
    if group is not None:
        group.remove()
