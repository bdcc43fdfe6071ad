"""cgroup v1: one hierarchy per controller, a private base group in each."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path

from tangram_celery.sandbox.cgroups.files import (
    BASE_PREFIX,
    CONTROLLERS,
    format_cpus,
    own_group_dir,
    purge_stale,
    write,
)
from tangram_celery.sandbox.cgroups.group import CgroupLimits
from tangram_celery.sandbox.cgroups.hierarchy import Hierarchy
from tangram_celery.sandbox.owner import owner_tag


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


class CgroupV1(Hierarchy):
    """Creates per-action cgroups below a private base in each writable v1 controller.

    The base is ``<mount>/<own path>/tangram-<pidns>-<pid>-<token>``, below the group this
    process lives in. Controllers that are missing or not writable are reported in
    :attr:`unavailable`.
    """

    version = 1
    oom_file = "memory.oom_control"
    chown_procs = True

    def __init__(
        self,
        controllers: Iterable[str] = CONTROLLERS,
        mountinfo: Path = Path("/proc/self/mountinfo"),
        proc_cgroup: Path = Path("/proc/self/cgroup"),
    ) -> None:
        super().__init__()
        try:
            mounts = parse_mountinfo(mountinfo.read_text())
            own = parse_proc_cgroup(proc_cgroup.read_text())
        except OSError as exc:
            reason = f"cannot read {exc.filename}: {exc.strerror}"
            self.unavailable = {c: reason for c in controllers}
            return
        tag = owner_tag(BASE_PREFIX)
        for controller in controllers:
            self._setup(controller, mounts, own, tag)

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

    def _apply(self, controller: str, path: Path, base: Path, limits: CgroupLimits) -> None:
        if controller == "memory":
            write(path / "memory.limit_in_bytes", str(limits.memory_bytes))
            with contextlib.suppress(OSError):
                write(path / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
        elif controller == "pids":
            write(path / "pids.max", str(limits.pids))
        elif controller == "cpuset":
            cpus = format_cpus(limits.cpus) if limits.cpus else \
                (base / "cpuset.cpus").read_text().strip()
            write(path / "cpuset.cpus", cpus)
            write(path / "cpuset.mems", (base / "cpuset.mems").read_text().strip())


def _inherit_cpuset(parent: Path, base: Path) -> None:
    """A fresh v1 cpuset is empty: copy the parent's cpus and mems into it."""
    for name in ("cpuset.cpus", "cpuset.mems"):
        value = (parent / name).read_text().strip()
        write(base / name, value)
