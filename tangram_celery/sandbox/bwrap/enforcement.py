"""What the embedded backend enforces on this host, from the cgroups, seccomp and homes it got."""

from __future__ import annotations

from tangram_celery.sandbox.bwrap.homes import Homes
from tangram_celery.sandbox.cgroups import Hierarchy
from tangram_celery.sandbox.isolation import (
    AFFINITY,
    CGROUP,
    CHECKED_AFTER,
    CPUSET,
    RLIMIT,
    TMPFS,
    WIDENABLE,
    Isolation,
)


def bwrap_isolation(mode: str, cgroups: Hierarchy | None, seccomp: bool,
                    homes: Homes) -> Isolation:
    """The :class:`Isolation` record of a bubblewrap backend with these layers."""
    used = set(cgroups.controllers) if cgroups is not None else set()
    reasons = ([f"{c}: {why}" for c, why in cgroups.unavailable.items()] if cgroups is not None
               else ["cgroups: turned off"])
    if not seccomp and "cpuset" not in used:
        reasons.append("cores: no cpuset and no seccomp filter, so an action can widen its "
                       "affinity")
    if not homes.tmpfs:
        reasons.append(homes.reason or "work dir: no tmpfs per sandbox (the node is not root, "
                                        "or it was turned off)")
    return Isolation(
        mode=mode,
        cgroups=cgroups.name if cgroups is not None and used else "no cgroups",
        cores=CPUSET if "cpuset" in used else AFFINITY if seccomp else WIDENABLE,
        memory=CGROUP if "memory" in used else RLIMIT,
        pids=CGROUP if "pids" in used else RLIMIT,
        workdir=TMPFS if homes.tmpfs else CHECKED_AFTER,
        reasons=tuple(reasons),
    )
