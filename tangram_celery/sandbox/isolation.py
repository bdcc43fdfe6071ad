"""What a sandbox backend enforces on this host, and the rule that it never degrades silently.

A node either enforces an action's cores and memory or refuses to start and says what is missing
and what to do. With ``TANGRAM_SANDBOX_ENFORCE=best-effort`` it runs anyway, and says so at
start, in ``tangram status``, on the dashboard and in every result (:meth:`Isolation.summary`).

How each limit is held, strongest first:

* cores: ``cpuset`` (a cgroup), else ``affinity`` (narrowed by the node from outside the
  sandbox, widening refused by seccomp); without seccomp ``affinity (widenable)``, which is
  not enforcement;
* memory: ``cgroup`` over the action's whole process tree, else ``rlimit`` per process;
* pids: ``cgroup``, else ``rlimit`` per uid;
* the work dir: ``tmpfs`` sized to its quota (a write past it fails with ENOSPC), else
  ``checked after each action``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tangram_celery.errors import SandboxSetupError

STRICT = "strict"
BEST_EFFORT = "best-effort"
ENFORCE_MODES = (STRICT, BEST_EFFORT)
CPUSET, AFFINITY, WIDENABLE = "cpuset", "affinity", "affinity (widenable)"
CGROUP, RLIMIT = "cgroup", "rlimit"
TMPFS, CHECKED_AFTER = "tmpfs", "checked after each action"
REQUIRED = ("cores", "memory")
"""What a strict node refuses to start without."""


@dataclass(frozen=True)
class Isolation:
    """How a backend holds each limit on this host (see the module docstring)."""

    mode: str
    cgroups: str
    cores: str
    memory: str
    pids: str
    workdir: str
    reasons: tuple[str, ...] = ()

    @property
    def gaps(self) -> tuple[str, ...]:
        """The limits not enforced here, by name."""
        held = {"cores": self.cores in (CPUSET, AFFINITY), "memory": self.memory == CGROUP,
                "pids": self.pids == CGROUP, "workdir": self.workdir == TMPFS}
        return tuple(name for name, ok in held.items() if not ok)

    def summary(self) -> str:
        """One line for a log, ``tangram status``, the dashboard and each result."""
        held = f"{self.cgroups}; cores {self.cores}, memory {self.memory}, pids {self.pids}, " \
               f"work dir {self.workdir}"
        if not self.gaps:
            return f"enforced: {held}"
        return f"{self.mode}, not enforced: {', '.join(self.gaps)} ({held})"

    def to_json(self) -> dict[str, object]:
        """The record as plain data."""
        return {**asdict(self), "reasons": list(self.reasons), "gaps": list(self.gaps)}


def check_mode(mode: str) -> str:
    """``mode`` if it is a known enforcement mode, else a :class:`SandboxSetupError`."""
    if mode not in ENFORCE_MODES:
        raise SandboxSetupError(f"enforcement mode {mode!r}: choose {STRICT!r} (refuse to start "
                                f"without cores and memory enforced) or {BEST_EFFORT!r}")
    return mode


def require(isolation: Isolation) -> None:
    """Raise :class:`SandboxSetupError` when a strict node cannot enforce cores or memory,
    naming what is missing, why, and what to do."""
    missing = [name for name in REQUIRED if name in isolation.gaps]
    if isolation.mode != STRICT or not missing:
        return
    why = "; ".join(isolation.reasons) or "no usable cgroup controllers"
    raise SandboxSetupError(
        f"the sandbox cannot enforce {' and '.join(missing)} on this host ({why}). Run the node "
        "as root on a host with cgroup v1 or v2 controllers, or give it a delegated cgroup v2 "
        "subtree (systemd Delegate=yes; a Kubernetes pod with a writable cgroup), or set "
        f"TANGRAM_SANDBOX_ENFORCE={BEST_EFFORT} to run without them (said at start, in "
        "`tangram status`, on the dashboard and in every result)")
