"""Placing an action's child before it runs: into cgroups of its own, on its cores.

A child born in its trajectory's groups, their cpuset already set to its cores, runs at once. One
that needs groups of its own, or whose cores no cpuset holds, waits: it reports its
kernel-attested pid, the node moves it and narrows its affinity from outside the sandbox (inside,
seccomp refuses ``sched_setaffinity``), and only then lets it go.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import threading
from collections.abc import Callable
from typing import TypeGuard

from tangram_celery.errors import SandboxLostError, SandboxSetupError
from tangram_celery.sandbox.bwrap.warm import child_pid
from tangram_celery.sandbox.cgroups import ActionCgroup


def moved(group: ActionCgroup | None) -> TypeGuard[ActionCgroup]:
    """Whether the action's child must be moved into ``group`` before it runs: only into groups
    of its own (a child is born in the trajectory's groups; without groups nothing moves)."""
    return group is not None and not group.spare


def cpuset_holds(group: ActionCgroup | None) -> bool:
    """Whether ``group`` holds the action's cores in a cpuset (else its affinity does)."""
    return group is not None and "cpuset" in group.paths


def held(group: ActionCgroup | None) -> bool:
    """Whether the action's child waits for the node before it runs: to be moved into groups of
    its own, or to have its affinity narrowed where no cpuset holds its cores."""
    return moved(group) or not cpuset_holds(group)


class ChildGone(Exception):
    """The action's child exited before it was placed in its cgroups or let go (it ran
    nothing)."""

    def __str__(self) -> str:
        return f"the action's child was gone before it was placed in its cgroups ({self.args[0]})"


def place_child(control: socket.socket, group: ActionCgroup | None, cores: tuple[int, ...],
                deadline: float) -> None:
    """Move the waiting child into the action's own groups and, where no cpuset holds its
    cores, narrow its affinity to them from out here (the sandbox cannot: seccomp refuses
    ``sched_setaffinity`` inside); then let it run."""
    pid = child_pid(control, deadline)
    if pid is None:
        raise SandboxLostError("the sandbox's warm executor did not start the action's "
                               "process; the next action gets a fresh executor")
    try:
        if moved(group):
            for procs in group.procs_files():
                with open(procs, "w") as fh:
                    fh.write(str(pid))
        if not cpuset_holds(group):
            os.sched_setaffinity(pid, cores)
    except OSError as exc:
        if exc.errno == errno.ESRCH:
            raise ChildGone(str(exc)) from exc
        raise SandboxSetupError(f"cannot place the action on its cores {list(cores)} "
                                f"and in its cgroups: {exc}") from exc
    try:
        control.sendall(b"g")
    except (BrokenPipeError, ConnectionResetError) as exc:  # it exited waiting for its go
        raise ChildGone(str(exc)) from exc


def killer(group: ActionCgroup | None, place_lock: threading.Lock
            ) -> Callable[[], None] | None:
    """What kills the rest of an action's processes when its child exits."""
    if group is None:
        return None

    def kill() -> None:
        kill_rest(group, place_lock)

    return kill


def kill_rest(group: ActionCgroup, place_lock: threading.Lock) -> None:
    """Kill what is left in an action's groups (in the trajectory's own groups, not while a
    concurrent action's child waits there to be moved)."""
    with place_lock if group.spare else contextlib.nullcontext():
        group.kill()
