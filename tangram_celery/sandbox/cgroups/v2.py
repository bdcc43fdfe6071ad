"""cgroup v2: one unified hierarchy; a private base group below this worker's own group.

v2's rule is that a group which hands controllers down to its children holds no processes
itself (the root group excepted). So, when the group this worker lives in does not yet hand
``cpuset``, ``memory`` and ``pids`` down, its processes first move into a leaf child
(:data:`LEAF`), and then the controllers are enabled in its ``cgroup.subtree_control``. This is
what systemd asks of a service with ``Delegate=yes``, and works the same in a Kubernetes pod
whose cgroup is writable. A worker whose own group does not offer the controllers (a root
worker in a service the host did not delegate them to) puts its base below the root group
instead, when it may write there. Below it: the base ``tangram-<pidns>-<pid>-<token>``
(which hands the controllers on), and one leaf group per trajectory or action with
``cpuset.cpus``, ``memory.max`` (``memory.swap.max`` 0) and ``pids.max``; OOM kills are read
from ``memory.events``.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterable
from pathlib import Path

from tangram_celery.sandbox.cgroups.files import (
    BASE_PREFIX,
    CONTROLLERS,
    format_cpus,
    own_group_dir,
    purge_stale,
    read_pids,
    write,
)
from tangram_celery.sandbox.cgroups.group import CgroupLimits
from tangram_celery.sandbox.cgroups.hierarchy import Hierarchy
from tangram_celery.sandbox.owner import owner_tag

LEAF = "tangram.leaf"
"""The child group this worker's group's own processes move into before it hands controllers
down."""
DELEGATE_HELP = ("give the node a cgroup v2 subtree with these controllers delegated (systemd: "
                 "Delegate=yes on its unit; Kubernetes: a pod whose cgroup is writable), run it "
                 "as root, or set TANGRAM_SANDBOX_ENFORCE=best-effort")


def parse_unified(text: str) -> tuple[Path, str] | None:
    """The cgroup v2 mount's (mount point, root inside the hierarchy), from mountinfo."""
    for line in text.splitlines():
        pre, sep, post = line.partition(" - ")
        fields, tail = pre.split(), post.split()
        if sep and len(fields) >= 5 and tail and tail[0] == "cgroup2":
            return Path(fields[4]), fields[3]
    return None


def unified_path(text: str) -> str | None:
    """This process's group in the unified hierarchy (the ``0::`` line of /proc/self/cgroup)."""
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


def read_list(path: Path) -> list[str]:
    """The words of a cgroup list file (``cgroup.controllers``, ``cgroup.subtree_control``)."""
    try:
        return path.read_text().split()
    except OSError:
        return []


def hand_down(parent: Path, controllers: Iterable[str]) -> list[int]:
    """Enable ``controllers`` in ``parent``'s ``cgroup.subtree_control``, moving the processes
    in ``parent`` into its :data:`LEAF` first unless it is the root group; the pids moved."""
    missing = [c for c in controllers if c not in read_list(parent / "cgroup.subtree_control")]
    if not missing:
        return []
    moved: list[int] = []
    if (parent / "cgroup.type").exists():
        pids = sorted(read_pids(parent))
        if pids:
            leaf = parent / LEAF
            leaf.mkdir(exist_ok=True)
            for pid in pids:
                try:
                    write(leaf / "cgroup.procs", str(pid))
                except OSError as exc:
                    if exc.errno != errno.ESRCH:
                        raise
                    continue
                moved.append(pid)
    write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in missing))
    return moved


def home_group(own: Path, top: Path, wanted: Iterable[str]) -> Path:
    """Where the base goes: this worker's own group when it offers every wanted controller
    (a delegated subtree); else the hierarchy's root group, when this worker may hand them down
    there (root on the host: the root group holds processes and still hands controllers down,
    so nothing is moved); else its own group, which then reports what it lacks."""
    wanted = list(wanted)
    if all(c in read_list(own / "cgroup.controllers") for c in wanted) or own == top:
        return own
    root = not (top / "cgroup.type").exists()
    if root and all(c in read_list(top / "cgroup.controllers") for c in wanted) \
            and os.access(top / "cgroup.subtree_control", os.W_OK):
        return top
    return own


class CgroupV2(Hierarchy):
    """Creates per-action cgroups in the unified hierarchy (see the module docstring).

    A controller the parent group does not offer (``cgroup.controllers``), or a parent this
    process cannot write, is reported in :attr:`unavailable` with what to do.
    """

    version = 2
    oom_file = "memory.events"

    def __init__(
        self,
        controllers: Iterable[str] = CONTROLLERS,
        mountinfo: Path = Path("/proc/self/mountinfo"),
        proc_cgroup: Path = Path("/proc/self/cgroup"),
    ) -> None:
        super().__init__()
        wanted = tuple(controllers)
        self.moved: list[int] = []
        try:
            unified = parse_unified(mountinfo.read_text())
            own = unified_path(proc_cgroup.read_text())
        except OSError as exc:
            self.unavailable = {c: f"cannot read {exc.filename}: {exc.strerror}" for c in wanted}
            return
        if unified is None or own is None:
            self.unavailable = {c: "no cgroup v2 hierarchy mounted" for c in wanted}
            return
        self._setup(home_group(own_group_dir(*unified, own), unified[0], wanted), wanted)

    def _setup(self, parent: Path, wanted: tuple[str, ...]) -> None:
        offered = read_list(parent / "cgroup.controllers")
        usable = [c for c in wanted if c in offered]
        for controller in wanted:
            if controller not in offered:
                self.unavailable[controller] = (
                    f"{parent} does not offer it (its cgroup.controllers: "
                    f"{' '.join(offered) or 'none'}); {DELEGATE_HELP}")
        if not usable:
            return
        purge_stale(parent)
        base = parent / owner_tag(BASE_PREFIX)
        try:
            self.moved = hand_down(parent, usable)
            base.mkdir()
            write(base / "cgroup.subtree_control", " ".join(f"+{c}" for c in usable))
        except OSError as exc:
            with contextlib.suppress(OSError):
                base.rmdir()
            reason = f"{parent} not writable: {exc.strerror or exc}; {DELEGATE_HELP}"
            self.unavailable.update({c: reason for c in usable})
            return
        self.bases = {c: base for c in usable}

    def _apply(self, controller: str, path: Path, base: Path, limits: CgroupLimits) -> None:
        if controller == "memory":
            write(path / "memory.max", str(limits.memory_bytes))
            with contextlib.suppress(OSError):
                write(path / "memory.swap.max", "0")
        elif controller == "pids":
            write(path / "pids.max", str(limits.pids))
        elif controller == "cpuset" and limits.cpus:
            write(path / "cpuset.cpus", format_cpus(limits.cpus))
