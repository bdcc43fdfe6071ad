"""The backend-neutral sandbox interface: limits, exec spec, outcome and the backend protocol.

A *sandbox backend* runs shell commands on behalf of trajectories. Each trajectory owns one work
directory that persists between its actions and disappears with ``end_trajectory``.
What every backend shares lives next to this contract: the validation of exec specs
(:mod:`~tangram_celery.sandbox.validation`), the work dir's files and size
(:mod:`~tangram_celery.sandbox.workdir`), the capped pumping of a child's output
(:mod:`~tangram_celery.sandbox.output`), owner tags (:mod:`~tangram_celery.sandbox.owner`) and
the ``pytest -n`` rewrite (:mod:`~tangram_celery.sandbox.parallelism`). Nothing here knows about
bubblewrap or Docker.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from tangram_celery.errors import SandboxSpecError
from tangram_celery.sandbox.isolation import Isolation

UNITS_ENV = "TANGRAM_UNITS"
MB = 1024 * 1024
INSIDE_WORKDIR = "/work"
"""Where every backend shows a trajectory's work dir to its commands (also their home)."""
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": INSIDE_WORKDIR,
    "USER": "sandbox",
    "LOGNAME": "sandbox",
    "TMPDIR": "/tmp",  # nosec B108 # inside the sandbox: its private tmpfs
    "LANG": "C.UTF-8",
}
"""The environment every sandboxed command starts from, on every backend."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-action resource limits of a sandbox (sizes in MiB).

    ``address_space_mb`` caps each process's virtual memory (RLIMIT_AS); ``None`` means four times
    ``memory_mb``, since interpreters reserve far more address space than they touch. The real
    per-action memory bound is ``memory_mb``: RLIMIT_DATA per process and a cgroup over the tree.
    """

    memory_mb: int = 512
    pids: int = 128
    file_size_mb: int = 64
    workdir_mb: int = 256
    tmp_mb: int = 64
    nofile: int = 256
    output_cap_bytes: int = 65536
    cpu_time_s: int | None = None
    address_space_mb: int | None = None
    max_memory_mb: int | None = None
    """The most memory one action may ask for (:attr:`ExecSpec.memory_mb`); None: ``memory_mb``."""

    def __post_init__(self) -> None:
        for name in ("memory_mb", "pids", "file_size_mb", "workdir_mb", "tmp_mb", "nofile"):
            if getattr(self, name) < 1:
                raise SandboxSpecError(f"limits.{name}", "must be a positive integer")
        if self.output_cap_bytes < 0:
            raise SandboxSpecError("limits.output_cap_bytes", "must be >= 0")
        if self.cpu_time_s is not None and self.cpu_time_s < 1:
            raise SandboxSpecError("limits.cpu_time_s", "must be >= 1 or None (no CPU-time cap)")
        if self.address_space_mb is not None and self.address_space_mb < self.memory_mb:
            raise SandboxSpecError("limits.address_space_mb", "must be >= memory_mb or None")
        if self.max_memory_mb is not None and self.max_memory_mb < self.memory_mb:
            raise SandboxSpecError("limits.max_memory_mb", "must be >= memory_mb or None")

    @property
    def effective_address_space_mb(self) -> int:
        """RLIMIT_AS in MiB: ``address_space_mb`` or four times ``memory_mb``."""
        return self.address_space_mb if self.address_space_mb is not None else 4 * self.memory_mb

    @property
    def ceiling_mb(self) -> int:
        """The most memory an action may ask for: ``max_memory_mb`` or ``memory_mb``."""
        return self.max_memory_mb if self.max_memory_mb is not None else self.memory_mb

    def address_space_for(self, memory_mb: int) -> int:
        """RLIMIT_AS in MiB of an action given ``memory_mb``: in the same ratio as the
        defaults' (``effective_address_space_mb`` over ``memory_mb``)."""
        return memory_mb * self.effective_address_space_mb // self.memory_mb


@dataclass(frozen=True)
class ExecSpec:
    """One command to run in a trajectory's sandbox.

    ``command`` runs as ``/bin/sh -c COMMAND`` in the trajectory's work dir after ``files``
    (relative path -> text) were written there. ``cores`` holds one core id per allocated unit;
    the sandbox is pinned to exactly those cores and ``TANGRAM_UNITS`` is ``len(cores)``.
    ``python``, when set, is the work-dir path of a Python script that is the whole action (a
    code action, whose ``command`` runs the same script): a backend with a warm interpreter
    runs it there, without starting one, and removes the script afterwards. ``memory_mb``
    replaces the limits' ``memory_mb`` for this command (up to their ``max_memory_mb``), and
    ``output_cap_bytes`` their output cap. ``keep_processes``: what the command starts in a
    session of its own outlives it (a Python session's interpreter), until a later command of
    the trajectory times out or the trajectory ends.
    """

    trajectory_id: str
    command: str
    files: Mapping[str, str]
    timeout_s: float
    cores: tuple[int, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    stdin: str | None = None
    python: str | None = None
    memory_mb: int | None = None
    output_cap_bytes: int | None = None
    keep_processes: bool = False


@dataclass(frozen=True)
class ExecOutcome:
    """What happened to one sandboxed command.

    ``exit_code`` follows the shell convention (``128 + n`` when the command died of signal ``n``,
    and then ``signal`` is ``n`` too); after a timeout the tree is killed, ``exit_code`` is
    ``None`` and ``signal`` is SIGKILL. ``setup_s`` is the time from the call until the command
    started inside the sandbox (file writes, cgroups, namespaces), ``exec_s`` the rest.
    ``workdir_bytes`` is the work dir's disk usage after the action; when it is over the quota,
    ``workdir_exceeded`` is set and the trajectory's next action raises :class:`WorkdirQuotaError`.
    """

    exit_code: int | None
    signal: int | None
    timed_out: bool
    oom_killed: bool
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    started_at: float
    finished_at: float
    setup_s: float
    exec_s: float
    workdir_bytes: int = 0
    workdir_exceeded: bool = False
    environment_replaced: bool = False
    replaced_reason: str = ""
    stdout_cut_bytes: int = 0
    """Bytes of stdout left out between the kept head and tail (0 when not truncated)."""
    stderr_cut_bytes: int = 0
    """The same for stderr."""


RunControl = Callable[[str, float], dict[str, Any]]
"""Sends ``grow``, ``shrink`` or ``status`` to a running malleable test run and returns its
answer, waiting at most the given seconds; raises ``OSError`` or ``ValueError`` when the run
does not answer (not listening yet, or ended)."""


@runtime_checkable
class ReachesRuns(Protocol):
    """A sandbox backend whose node reaches the malleable test runs inside its sandboxes."""

    def run_control(self, trajectory_id: str, name: str) -> RunControl | None:
        """The control of the malleable run listening at ``name`` in the work dir of
        ``trajectory_id``'s running action (None: the trajectory holds no sandbox now)."""
        ...


@runtime_checkable
class SandboxBackend(Protocol):
    """Runs commands for trajectories, each in its own persistent work dir. Thread-safe."""

    name: str
    repins: bool
    """Whether :meth:`repin` can move a running action onto other cores; a node lends cores
    of running actions only on a backend that can."""
    isolation: Isolation
    """How it holds each limit on this host (and, run best-effort, what it does not)."""

    def run(self, spec: ExecSpec) -> ExecOutcome:
        """Run ``spec.command`` in the trajectory's sandbox and return its outcome."""
        ...

    def repin(self, trajectory_id: str, cores: tuple[int, ...], new_cores: tuple[int, ...]
              ) -> bool:
        """Move the running action of ``trajectory_id`` pinned to ``cores`` onto ``new_cores``
        at once; False, changing nothing, when that cannot be done now (the caller must then not
        lend those cores). Always False when :attr:`repins` is False."""
        ...

    def end_trajectory(self, trajectory_id: str) -> None:
        """Kill what the trajectory still runs and remove its work dir; idempotent."""
        ...

    def trajectories(self) -> list[str]:
        """The ids of the trajectories that currently hold a work dir."""
        ...

    def close(self) -> None:
        """End every trajectory and release everything the backend holds."""
        ...
