"""One action's (or trajectory's) cgroups and the limits they are made with."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tangram_celery.sandbox.cgroups.files import (
    format_cpus,
    kill_group,
    read_pids,
    remove_group,
    write,
)


@dataclass(frozen=True)
class CgroupLimits:
    """The limits of one action's cgroups."""

    memory_bytes: int
    pids: int
    cpus: tuple[int, ...]


@dataclass
class ActionCgroup:
    """The cgroups of one action: a directory per controller (cgroup v1) or one directory for
    all of them (v2, where every controller maps to the same path).

    A trajectory's own groups hold its sandbox (bubblewrap and the warm executor, the
    ``spare`` pids that :meth:`kill` leaves alone), so an action's child is born in them: no
    migration, which on cgroup v1 waits for an RCU grace period (milliseconds) when the
    hierarchy was idle. ``oom_base`` is the OOM-kill count before the current action;
    ``oom_file`` is where the memory controller counts its kills (``memory.oom_control`` on
    v1, ``memory.events`` on v2; both have an ``oom_kill N`` line).
    """

    paths: dict[str, Path]
    spare: frozenset[int] = frozenset()
    oom_base: int = 0
    oom_file: str = "memory.oom_control"
    memory_bytes: int = 0
    """The memory limit the group holds now (0: unknown)."""

    def dirs(self) -> list[Path]:
        """The distinct directories of the groups."""
        return list(dict.fromkeys(self.paths.values()))

    def procs_files(self) -> list[Path]:
        """The ``cgroup.procs`` files a pid is written into to join every group."""
        return [p / "cgroup.procs" for p in self.dirs()]

    def pids(self) -> set[int]:
        """Every process still in the action's groups."""
        return set().union(*(read_pids(p) for p in self.dirs()))

    def oom_count(self) -> int:
        """How many processes the memory controller OOM-killed in these groups so far."""
        path = self.paths.get("memory")
        if path is None:
            return 0
        try:
            text = (path / self.oom_file).read_text()
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
        pids = list(pids)
        for procs in self.procs_files():
            for pid in pids:
                write(procs, str(pid))

    def set_cpus(self, cpus: Iterable[int]) -> bool:
        """Pin the action to ``cpus`` from now on (its cpuset; running processes move at once,
        processes joining later are born there); False without a cpuset group. Raises OSError
        when the kernel refuses the set (for example cores outside the parent's cpuset)."""
        path = self.paths.get("cpuset")
        if path is None:
            return False
        write(path / "cpuset.cpus", format_cpus(cpus))
        return True

    def set_memory(self, limit: int) -> None:
        """Hold the group's memory (and memory+swap) at ``limit`` bytes from now on; raises
        OSError when the kernel refuses (usage above a lower limit)."""
        path = self.paths.get("memory")
        if path is None or limit == self.memory_bytes:
            return
        if (path / "memory.max").exists():
            write(path / "memory.max", str(limit))
        else:
            names = ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"]
            if limit > self.memory_bytes:
                names.reverse()
            for name in names:
                if (path / name).exists():
                    write(path / name, str(limit))
        self.memory_bytes = limit

    def kill(self, timeout_s: float = 2.0) -> bool:
        """SIGKILL everything left in the groups but the spare pids; True when that is all."""
        return kill_group(self.dirs(), time.monotonic() + timeout_s, self.spare)

    def remove(self, timeout_s: float = 2.0) -> bool:
        """Kill what is left and remove the groups; True when all are gone."""
        deadline = time.monotonic() + timeout_s
        kill_group(self.dirs(), deadline)
        return all([remove_group(p, deadline) for p in self.dirs()])
