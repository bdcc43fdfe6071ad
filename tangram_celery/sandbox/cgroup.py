"""Per-action cgroup (v1) limits: memory, pids and cpuset, created and removed around each action.

The backend makes one private base group per controller, below the cgroup its own process lives
in (``<mount>/<own path>/tangram-<pidns>-<pid>-<token>``), and one child group per action. A
launcher joins the action's groups by writing its own pid into their ``cgroup.procs`` (chowned
to the sandbox uid), so every process of the sandbox is born inside them. Controllers that are
missing or not writable are reported in :attr:`CgroupV1.unavailable` and simply not used; rlimits
remain as the fallback. The cgroup v2 unified hierarchy is not handled yet (on this project's
machines it has no controllers); hosts without writable v1 controllers run with rlimits and CPU
affinity only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tangram_celery.sandbox.owner import is_stale_tag, owner_tag

CONTROLLERS = ("memory", "pids", "cpuset")
BASE_PREFIX = "tangram-"


@dataclass(frozen=True)
class CgroupLimits:
    """The limits of one action's cgroups."""

    memory_bytes: int
    pids: int
    cpus: tuple[int, ...]


def parse_mountinfo(
    text: str, controllers: Iterable[str] = CONTROLLERS
) -> dict[str, tuple[Path, str]]:
    """Map each v1 controller of ``controllers`` to (mount point, root inside the hierarchy)."""
    wanted = set(controllers)
    found: dict[str, tuple[Path, str]] = {}
    for line in text.splitlines():
        pre, sep, post = line.partition(" - ")
        if not sep:
            continue
        fields, tail = pre.split(), post.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] != "cgroup":
            continue
        for option in tail[2].split(","):
            if option in wanted and option not in found:
                found[option] = (Path(fields[4]), fields[3])
    return found


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """Map each v1 controller to this process's cgroup path, from ``/proc/self/cgroup``."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(","):
            if controller:
                paths[controller] = parts[2]
    return paths


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
        for child in _subdirs(group):
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


def _subdirs(path: Path) -> Iterator[Path]:
    try:
        with os.scandir(path) as entries:
            found = [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    yield from found


def _write(path: Path, value: str) -> None:
    path.write_text(value)


@dataclass
class ActionCgroup:
    """The cgroups of one action, one directory per controller.

    A trajectory's own groups hold its sandbox (bubblewrap and the warm executor, the
    ``spare`` pids that :meth:`kill` leaves alone), so an action's child is born in them: no
    migration, which on cgroup v1 waits for an RCU grace period (milliseconds) when the
    hierarchy was idle. ``oom_base`` is the OOM-kill count before the current action.
    """

    paths: dict[str, Path]
    spare: frozenset[int] = frozenset()
    oom_base: int = 0

    def procs_files(self) -> list[Path]:
        """The ``cgroup.procs`` files a launcher writes its pid into to join every group."""
        return [p / "cgroup.procs" for p in self.paths.values()]

    def pids(self) -> set[int]:
        """Every process still in the action's groups."""
        return set().union(*(read_pids(p) for p in self.paths.values()))

    def oom_count(self) -> int:
        """How many processes the memory controller OOM-killed in these groups so far."""
        path = self.paths.get("memory")
        if path is None:
            return 0
        try:
            text = (path / "memory.oom_control").read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0

    def oom_killed(self) -> bool:
        """Whether the memory controller OOM-killed a process of this action."""
        return self.oom_count() > self.oom_base

    def join(self, pids: Iterable[int]) -> None:
        """Move ``pids`` into every group; raises OSError."""
        for procs in self.procs_files():
            for pid in pids:
                _write(procs, str(pid))

    def set_cpus(self, cpus: Iterable[int]) -> bool:
        """Pin the action to ``cpus`` from now on (its cpuset; running processes move at once,
        processes joining later are born there); False without a cpuset group. Raises OSError
        when the kernel refuses the set (for example cores outside the parent's cpuset)."""
        path = self.paths.get("cpuset")
        if path is None:
            return False
        _write(path / "cpuset.cpus", format_cpus(cpus))
        return True

    def kill(self, timeout_s: float = 2.0) -> bool:
        """SIGKILL everything left in the groups but the spare pids; True when that is all."""
        return kill_group(self.paths.values(), time.monotonic() + timeout_s, self.spare)

    def remove(self, timeout_s: float = 2.0) -> bool:
        """Kill what is left and remove the groups; True when all are gone."""
        deadline = time.monotonic() + timeout_s
        kill_group(self.paths.values(), deadline)
        return all([remove_group(p, deadline) for p in self.paths.values()])


class CgroupV1:
    """Creates per-action cgroups below a private base in each writable v1 controller."""

    def __init__(
        self,
        controllers: Iterable[str] = CONTROLLERS,
        mountinfo: Path = Path("/proc/self/mountinfo"),
        proc_cgroup: Path = Path("/proc/self/cgroup"),
    ) -> None:
        self.bases: dict[str, Path] = {}
        self.unavailable: dict[str, str] = {}
        self._counter = 0
        try:
            mounts = parse_mountinfo(mountinfo.read_text())
            own = parse_proc_cgroup(proc_cgroup.read_text())
        except OSError as exc:
            mounts, own = {}, {}
            reason = f"cannot read {exc.filename}: {exc.strerror}"
            self.unavailable = {c: reason for c in controllers}
            return
        tag = owner_tag(BASE_PREFIX)
        for controller in controllers:
            self._setup(controller, mounts, own, tag)

    @property
    def controllers(self) -> tuple[str, ...]:
        """The controllers in use."""
        return tuple(self.bases)

    def _setup(
        self, controller: str, mounts: dict[str, tuple[Path, str]], own: dict[str, str], tag: str
    ) -> None:
        if controller not in mounts or controller not in own:
            self.unavailable[controller] = "no cgroup v1 hierarchy mounted for it"
            return
        mount, root = mounts[controller]
        parent = own_group_dir(mount, root, own[controller])
        purge_stale(parent)
        base = parent / tag
        try:
            base.mkdir()
            if controller == "cpuset":
                _inherit_cpuset(parent, base)
        except OSError as exc:
            with contextlib.suppress(OSError):
                base.rmdir()
            self.unavailable[controller] = f"{base} not writable: {exc.strerror or exc}"
            return
        self.bases[controller] = base

    def create(self, limits: CgroupLimits, uid: int, gid: int,
               prefix: str = "a") -> ActionCgroup | None:
        """Make one action's groups with ``limits``; the launcher (``uid``) may join them.

        ``prefix`` starts the groups' name (``a``: an action's, ``t``: a trajectory's); empty
        ``limits.cpus`` take the base's cpuset. Returns None when no controller is usable.
        Raises OSError when a write fails (for example cores outside the parent's cpuset);
        what was made is removed first.
        """
        if not self.bases:
            return None
        self._counter += 1
        name = f"{prefix}{self._counter}-{os.urandom(3).hex()}"
        group = ActionCgroup({})
        try:
            for controller, base in self.bases.items():
                path = base / name
                path.mkdir()
                group.paths[controller] = path
                _apply(controller, path, base, limits)
                os.chown(path / "cgroup.procs", uid, gid)
        except OSError:
            group.remove(timeout_s=1.0)
            raise
        return group

    def close(self, timeout_s: float = 5.0) -> None:
        """Kill anything left in the base groups and remove them."""
        deadline = time.monotonic() + timeout_s
        for base in self.bases.values():
            remove_group(base, deadline, recursive=True)
        self.bases.clear()


def _inherit_cpuset(parent: Path, base: Path) -> None:
    """A fresh v1 cpuset is empty: copy the parent's cpus and mems into it."""
    for name in ("cpuset.cpus", "cpuset.mems"):
        value = (parent / name).read_text().strip()
        _write(base / name, value)


def _apply(controller: str, path: Path, base: Path, limits: CgroupLimits) -> None:
    """Write one controller's limits into an action group."""
    if controller == "memory":
        _write(path / "memory.limit_in_bytes", str(limits.memory_bytes))
        with contextlib.suppress(OSError):
            _write(path / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
    elif controller == "pids":
        _write(path / "pids.max", str(limits.pids))
    elif controller == "cpuset":
        cpus = format_cpus(limits.cpus) if limits.cpus else \
            (base / "cpuset.cpus").read_text().strip()
        _write(path / "cpuset.cpus", cpus)
        _write(path / "cpuset.mems", (base / "cpuset.mems").read_text().strip())


def purge_stale(parent: Path) -> None:
    """Remove base groups left by backends whose process is gone (see :func:`owner_tag`)."""
    for entry in _subdirs(parent):
        if is_stale_tag(entry.name, BASE_PREFIX):
            remove_group(entry, time.monotonic() + 2.0, recursive=True)
