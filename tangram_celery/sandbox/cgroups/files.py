"""The cgroup file interface both hierarchies share: pids, kills, removals and cpu lists."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from tangram_celery.sandbox.owner import is_stale_tag

CONTROLLERS = ("memory", "pids", "cpuset")
BASE_PREFIX = "tangram-"


def own_group_dir(mount: Path, root: str, own: str) -> Path:
    """The directory of this process's group: ``own`` is relative to the mount's ``root``."""
    if root != "/" and (own == root or own.startswith(root.rstrip("/") + "/")):
        own = own[len(root):]
    elif root != "/":
        own = "/"
    return mount / own.lstrip("/")


def format_cpus(cpus: Iterable[int]) -> str:
    """``(3, 0, 1, 0)`` -> ``"0,1,3"`` (the cpuset list syntax, duplicates dropped)."""
    return ",".join(str(c) for c in sorted(set(cpus)))


def read_pids(group: Path) -> set[int]:
    """The pids in a group (empty when the group is gone)."""
    try:
        text = (group / "cgroup.procs").read_text()
    except OSError:
        return set()
    return {int(tok) for tok in text.split()}


def kill_group(groups: Iterable[Path], deadline: float,
               spare: frozenset[int] = frozenset()) -> bool:
    """SIGKILL every process of the groups but ``spare`` until only those are left or
    ``deadline`` passes."""
    groups = list(groups)
    while True:
        pids = set().union(*(read_pids(g) for g in groups)) - spare if groups else set()
        if not pids:
            return True
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)


def remove_group(group: Path, deadline: float, recursive: bool = False) -> bool:
    """rmdir a group (and, if ``recursive``, its children first), retrying while tasks die."""
    if recursive:
        for child in subdirs(group):
            remove_group(child, deadline, recursive=True)
    while True:
        try:
            group.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            kill_group([group], deadline)
            time.sleep(0.005)


def subdirs(path: Path) -> Iterator[Path]:
    """The sub-directories of ``path`` (none when it cannot be read)."""
    try:
        with os.scandir(path) as entries:
            found = [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    yield from found


def write(path: Path, value: str) -> None:
    """Write one value into a cgroup file (raises OSError as the kernel refuses it)."""
    path.write_text(value)


def purge_stale(parent: Path) -> None:
    """Remove base groups left by backends whose process is gone (see
    :func:`~tangram_celery.sandbox.owner.owner_tag`)."""
    for entry in subdirs(parent):
        if is_stale_tag(entry.name, BASE_PREFIX):
            remove_group(entry, time.monotonic() + 2.0, recursive=True)
