"""A sandbox container's cores: pinned to an action's cores during it, throttled between actions.

Two ways to do it, chosen once per container:

- :class:`CgroupCpu` writes the container's own cgroup files on the host (``cpuset.cpus`` and
  the CFS quota), found from the host pid of its init through ``/proc/PID/cgroup``. That needs
  the node to run on the engine's host, as root, seeing the host's pids and cgroups; a write
  costs well under a millisecond, no engine call.
- :class:`ApiCpu` asks the engine (``container.update``, one API call each way), for a node that
  reaches the engine remotely or from inside a container of its own.

:func:`container_cpu` picks :class:`CgroupCpu` when the files are there, writable, and belong to
the container (its id is in their path), else :class:`ApiCpu`.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import docker.errors

from tangram_celery.errors import SandboxSpecError
from tangram_celery.sandbox.cgroups.files import format_cpus, own_group_dir
from tangram_celery.sandbox.cgroups.v1 import parse_mountinfo
from tangram_celery.sandbox.docker.engine import API_ERRORS
from tangram_celery.sandbox.docker.options import (
    CPU_PERIOD_US,
    IDLE_CPU_QUOTA_US,
    cpu_options,
    idle_cpu_options,
)
from tangram_celery.sandbox.docker.protocol import Broken

V1_CONTROLLERS = ("cpuset", "cpu")


class ContainerCpu(Protocol):
    """Pins a container to an action's cores and throttles it between actions."""

    kind: str

    def pin(self, cores: Sequence[int]) -> None:
        """Give the container exactly ``cores`` (a CFS quota of one period per distinct core)."""

    def idle(self) -> None:
        """Throttle the container to 1% of a core."""


@dataclass
class ApiCpu:
    """Through the engine: ``container.update``."""

    container: Any
    kind: str = "api"

    def pin(self, cores: Sequence[int]) -> None:
        """One ``container.update`` call; raises SandboxSpecError or Broken."""
        try:
            self.container.update(**cpu_options(cores))
        except docker.errors.APIError as exc:
            if "not available" in str(exc):
                raise SandboxSpecError("cores", f"{exc}; allocate cores the engine has") from exc
            raise Broken(f"cannot pin the container to cores {list(cores)}: {exc}") from exc
        except API_ERRORS as exc:
            raise Broken(f"cannot pin the container: {exc}") from exc

    def idle(self) -> None:
        """One ``container.update`` call; raises Broken."""
        try:
            self.container.update(**idle_cpu_options())
        except API_ERRORS as exc:
            raise Broken(f"cannot throttle the container after an action: {exc}") from exc


@dataclass
class CgroupCpu:
    """Through the container's cgroup files on the host."""

    cpus: Path
    quota: Path
    v2: bool
    kind: str = "cgroup"

    def pin(self, cores: Sequence[int]) -> None:
        """Two file writes; raises SandboxSpecError or Broken."""
        try:
            self._write_quota(len(set(cores)) * CPU_PERIOD_US)
            self.cpus.write_text(format_cpus(cores))
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                raise SandboxSpecError("cores", f"the host refuses cpuset {format_cpus(cores)}"
                                       f" ({exc.strerror}); allocate cores the host has") from exc
            raise Broken(f"cannot pin the container to cores {list(cores)}: {exc}") from exc

    def idle(self) -> None:
        """One file write; raises Broken."""
        try:
            self._write_quota(IDLE_CPU_QUOTA_US)
        except OSError as exc:
            raise Broken(f"cannot throttle the container after an action: {exc}") from exc

    def _write_quota(self, quota_us: int) -> None:
        text = f"{quota_us} {CPU_PERIOD_US}" if self.v2 else str(quota_us)
        self.quota.write_text(text)


def cgroup_files(
    container_id: str, proc_cgroup: str, mountinfo: str
) -> tuple[Path, Path, bool] | None:
    """(cpuset.cpus, quota file, is v2) of the container's cgroup, or None.

    ``proc_cgroup`` is ``/proc/PID/cgroup`` of its init and ``mountinfo`` the node's own
    ``/proc/self/mountinfo``. None unless each path names the container's id. Pure.
    """
    v1: dict[str, str] = {}
    unified = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            unified = parts[2]
        for controller in parts[1].split(","):
            if controller in V1_CONTROLLERS:
                v1[controller] = parts[2]
    mounts = parse_mountinfo(mountinfo, V1_CONTROLLERS)
    if all(c in v1 and c in mounts for c in V1_CONTROLLERS):
        paths = {c: own_group_dir(*mounts[c], v1[c]) for c in V1_CONTROLLERS}
        if all(container_id in str(p) for p in paths.values()):
            return paths["cpuset"] / "cpuset.cpus", paths["cpu"] / "cpu.cfs_quota_us", False
        return None
    root = _cgroup2_mount(mountinfo)
    if unified is None or root is None or container_id not in unified:
        return None
    group = root / unified.lstrip("/")
    return group / "cpuset.cpus", group / "cpu.max", True


def _cgroup2_mount(mountinfo: str) -> Path | None:
    for line in mountinfo.splitlines():
        pre, sep, post = line.partition(" - ")
        fields, tail = pre.split(), post.split()
        if sep and len(fields) >= 5 and tail and tail[0] == "cgroup2" and fields[3] == "/":
            return Path(fields[4])
    return None


def container_cpu(container: Any, *, direct: bool = True) -> ContainerCpu:
    """How to pin ``container`` (started; its attrs reloaded): its cgroup files if the node can
    write them (and ``direct``), else the engine's API."""
    if direct:
        found = _direct(container)
        if found is not None:
            return found
    return ApiCpu(container)


def _direct(container: Any) -> CgroupCpu | None:
    pid = (container.attrs.get("State") or {}).get("Pid")
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        proc_cgroup = Path(f"/proc/{pid}/cgroup").read_text()
        mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return None
    files = cgroup_files(str(container.id), proc_cgroup, mountinfo)
    if files is None:
        return None
    cpus, quota, v2 = files
    try:
        cpus.write_text(cpus.read_text().strip() or "0")
    except OSError:
        return None
    return CgroupCpu(cpus, quota, v2)
