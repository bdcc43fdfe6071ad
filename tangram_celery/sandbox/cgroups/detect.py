"""Which cgroup hierarchy a host runs: v1 where its controllers are mounted, else v2."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tangram_celery.sandbox.cgroups.files import CONTROLLERS
from tangram_celery.sandbox.cgroups.hierarchy import Hierarchy
from tangram_celery.sandbox.cgroups.v1 import CgroupV1, parse_mountinfo
from tangram_celery.sandbox.cgroups.v2 import CgroupV2, parse_unified


def open_cgroups(
    controllers: Iterable[str] = CONTROLLERS,
    mountinfo: Path = Path("/proc/self/mountinfo"),
    proc_cgroup: Path = Path("/proc/self/cgroup"),
) -> Hierarchy:
    """This host's hierarchy, set up for per-action groups: cgroup v1 when any of
    ``controllers`` has a v1 mount (a v1 or hybrid host), else v2 when the unified hierarchy is
    mounted; either reports in ``unavailable`` what it cannot use and why."""
    wanted = tuple(controllers)
    try:
        text = mountinfo.read_text()
    except OSError:
        return CgroupV1(wanted, mountinfo, proc_cgroup)
    if not parse_mountinfo(text, wanted) and parse_unified(text) is not None:
        return CgroupV2(wanted, mountinfo, proc_cgroup)
    return CgroupV1(wanted, mountinfo, proc_cgroup)
