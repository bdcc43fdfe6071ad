"""What both cgroup hierarchies do alike: make an action's groups below a private base, and
remove them all at the end."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tangram_celery.sandbox.cgroups.files import remove_group
from tangram_celery.sandbox.cgroups.group import ActionCgroup, CgroupLimits


class Hierarchy:
    """Per-action cgroups below a private base group (see the subclasses for each version).

    :attr:`bases` maps each controller in use to its base directory; :attr:`unavailable` maps
    each controller that is not to the reason, which the backend reports (and, unless told to
    run best-effort, refuses to start over).
    """

    version = 0
    oom_file = ""
    chown_procs = False

    def __init__(self) -> None:
        self.bases: dict[str, Path] = {}
        self.unavailable: dict[str, str] = {}
        self._counter = 0

    @property
    def controllers(self) -> tuple[str, ...]:
        """The controllers in use."""
        return tuple(self.bases)

    @property
    def name(self) -> str:
        """``cgroup v1`` or ``cgroup v2``."""
        return f"cgroup v{self.version}"

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
        group = ActionCgroup({}, oom_file=self.oom_file, memory_bytes=limits.memory_bytes)
        try:
            for controller, base in self.bases.items():
                path = base / name
                if path not in group.paths.values():
                    path.mkdir()
                    if self.chown_procs:
                        os.chown(path / "cgroup.procs", uid, gid)
                group.paths[controller] = path
                self._apply(controller, path, base, limits)
        except OSError:
            group.remove(timeout_s=1.0)
            raise
        return group

    def close(self, timeout_s: float = 5.0) -> None:
        """Kill anything left in the base groups and remove them."""
        deadline = time.monotonic() + timeout_s
        for base in dict.fromkeys(self.bases.values()):
            remove_group(base, deadline, recursive=True)
        self.bases.clear()

    def _apply(self, controller: str, path: Path, base: Path, limits: CgroupLimits) -> None:
        """Write one controller's limits into an action group."""
        raise NotImplementedError
