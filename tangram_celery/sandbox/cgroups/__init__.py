"""Per-action cgroups on cgroup v1 and v2: memory, pids and cpuset, made and removed around each
action (and each trajectory's sandbox).

* :mod:`~tangram_celery.sandbox.cgroups.files`: the file interface both hierarchies share.
* :mod:`~tangram_celery.sandbox.cgroups.group`: :class:`ActionCgroup` and :class:`CgroupLimits`.
* :mod:`~tangram_celery.sandbox.cgroups.hierarchy`: what both versions do alike.
* :mod:`~tangram_celery.sandbox.cgroups.v1` and :mod:`~tangram_celery.sandbox.cgroups.v2`.
* :mod:`~tangram_celery.sandbox.cgroups.detect`: :func:`open_cgroups`, the host's hierarchy.
"""

from __future__ import annotations

from tangram_celery.sandbox.cgroups.detect import open_cgroups
from tangram_celery.sandbox.cgroups.files import format_cpus
from tangram_celery.sandbox.cgroups.group import ActionCgroup, CgroupLimits
from tangram_celery.sandbox.cgroups.hierarchy import Hierarchy
from tangram_celery.sandbox.cgroups.v1 import CgroupV1
from tangram_celery.sandbox.cgroups.v2 import CgroupV2

__all__ = ["ActionCgroup", "CgroupLimits", "CgroupV1", "CgroupV2", "Hierarchy", "format_cpus",
           "open_cgroups"]
