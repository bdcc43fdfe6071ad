"""The backend-neutral sandbox interface and the helpers every backend shares.

A *sandbox backend* runs shell commands on behalf of trajectories. Each trajectory owns one work
directory that persists between its actions and disappears with ``end_trajectory``.
This module holds the contract (limits, exec spec, outcome, protocol), the validation of exec specs,
the safe writing of spec files into a work dir, the work-dir size check, the capped pumping of a
child's output and the ``pytest -n`` rewrite. Nothing here knows about bubblewrap or Docker.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
import secrets
import selectors
import stat
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from tangram_celery.errors import (
    SandboxSpecError,
)

TRAJECTORY_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
UNITS_ENV = "TANGRAM_UNITS"
MAX_FILES = 10_000
MAX_ENV_BYTES = 96 * 1024
MAX_COMMAND_BYTES = 96 * 1024
MAX_TIMEOUT_S = 24 * 3600.0
MB = 1024 * 1024




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

    @property
    def effective_address_space_mb(self) -> int:
        """RLIMIT_AS in MiB: ``address_space_mb`` or four times ``memory_mb``."""
        return self.address_space_mb if self.address_space_mb is not None else 4 * self.memory_mb


@dataclass(frozen=True)
class ExecSpec:
    """One command to run in a trajectory's sandbox.

    ``command`` runs as ``/bin/sh -c COMMAND`` in the trajectory's work dir after ``files``
    (relative path -> text) were written there. ``cores`` holds one core id per allocated unit;
    the sandbox is pinned to exactly those cores and ``TANGRAM_UNITS`` is ``len(cores)``.
    """

    trajectory_id: str
    command: str
    files: Mapping[str, str]
    timeout_s: float
    cores: tuple[int, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    stdin: str | None = None


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


@runtime_checkable
class SandboxBackend(Protocol):
    """Runs commands for trajectories, each in its own persistent work dir. Thread-safe."""

    name: str

    def run(self, spec: ExecSpec) -> ExecOutcome:
        """Run ``spec.command`` in the trajectory's sandbox and return its outcome."""
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


# ---------------------------------------------------------------------------------------------
# Validation


@dataclass(frozen=True)
class SpecFile:
    """One validated spec file: its path components and its encoded content."""

    parts: tuple[str, ...]
    data: bytes

    @property
    def name(self) -> str:
        """The path as written in the spec, normalised."""
        return "/".join(self.parts)


def validate_trajectory_id(trajectory_id: object) -> str:
    """Return the id if it matches ``^[A-Za-z0-9._:-]{1,128}$``, else raise."""
    if not isinstance(trajectory_id, str) or not TRAJECTORY_ID_RE.match(trajectory_id):
        raise SandboxSpecError(
            "trajectory_id", "must match ^[A-Za-z0-9._:-]{1,128}$; pass the action's trajectory id"
        )
    return trajectory_id


def split_relative_path(path: object, field_name: str) -> tuple[str, ...]:
    """Split a relative file path into components, refusing anything that could leave the dir."""
    if not isinstance(path, str) or not path:
        raise SandboxSpecError(field_name, "file path must be a non-empty string")
    if "\x00" in path:
        raise SandboxSpecError(field_name, "file path contains a NUL byte")
    if path.startswith("/"):
        raise SandboxSpecError(field_name, "absolute paths are refused; give a path relative to "
                               "the work dir, e.g. 'src/main.py'")
    parts = tuple(p for p in path.split("/") if p not in ("", "."))
    if any(p == ".." for p in parts):
        raise SandboxSpecError(field_name, "'..' is refused; give a path inside the work dir")
    if not parts:
        raise SandboxSpecError(field_name, "file path names the work dir itself; name a file")
    if len(path.encode()) > 4096 or any(len(p.encode()) > 255 for p in parts):
        raise SandboxSpecError(field_name, "file path too long (max 4096 bytes, 255 per name)")
    return parts


def validate_files(files: Mapping[str, str], limits: SandboxLimits) -> list[SpecFile]:
    """Validate and encode spec files against the per-file and work-dir size limits."""
    if len(files) > MAX_FILES:
        raise SandboxSpecError("files", f"{len(files)} files; at most {MAX_FILES} per action")
    out: list[SpecFile] = []
    total = 0
    for path, content in files.items():
        where = f"files[{path!r}]"
        parts = split_relative_path(path, where)
        if not isinstance(content, str):
            raise SandboxSpecError(where, "file content must be text (str)")
        data = content.encode("utf-8", errors="surrogateescape")
        if len(data) > limits.file_size_mb * MB:
            raise SandboxSpecError(where, f"{len(data)} bytes is over the per-file limit of "
                                   f"{limits.file_size_mb} MiB; ship smaller files")
        total += len(data)
        out.append(SpecFile(parts, data))
    if total > limits.workdir_mb * MB:
        raise SandboxSpecError("files", f"{total} bytes in all is over the work-dir quota of "
                               f"{limits.workdir_mb} MiB; ship fewer or smaller files")
    return out


def validate_env(env: Mapping[str, str]) -> dict[str, str]:
    """Validate extra environment variables (POSIX names, no NUL, bounded size)."""
    size = 0
    clean: dict[str, str] = {}
    for key, value in env.items():
        where = f"env[{key!r}]"
        if not isinstance(key, str) or not ENV_NAME_RE.match(key):
            raise SandboxSpecError(where, "variable names must match [A-Za-z_][A-Za-z0-9_]*")
        if not isinstance(value, str) or "\x00" in value:
            raise SandboxSpecError(where, "value must be a string without NUL bytes")
        size += len(key) + len(value.encode()) + 2
        clean[key] = value
    if size > MAX_ENV_BYTES:
        raise SandboxSpecError("env", f"{size} bytes of environment; at most {MAX_ENV_BYTES}")
    return clean


def validate_cores(cores: object, available: frozenset[int]) -> tuple[int, ...]:
    """Check the allocated cores: a non-empty tuple of ids this host lets us use.

    One id per unit; an id may repeat when a node oversubscribes its CPUs (several units on one
    CPU): the sandbox is pinned to the set of ids and ``TANGRAM_UNITS`` is the tuple's length.
    """
    if not isinstance(cores, tuple) or not cores:
        raise SandboxSpecError("cores", "must be a non-empty tuple of core ids (one per unit)")
    if any(not isinstance(c, int) or isinstance(c, bool) or c < 0 for c in cores):
        raise SandboxSpecError("cores", "core ids must be non-negative integers")
    missing = sorted(set(cores) - available)
    if missing:
        raise SandboxSpecError("cores", f"cores {missing} are not usable on this host "
                               f"(usable: {sorted(available)}); allocate from those")
    return cores


def validate_spec(
    spec: ExecSpec, limits: SandboxLimits, available_cores: frozenset[int]
) -> list[SpecFile]:
    """Raise :class:`SandboxSpecError` naming the first bad field of ``spec``.

    Returns the spec's files, validated and encoded, ready for :func:`write_files`.
    """
    validate_trajectory_id(spec.trajectory_id)
    if not isinstance(spec.command, str) or "\x00" in spec.command:
        raise SandboxSpecError("command", "must be a string without NUL bytes")
    if len(spec.command.encode("utf-8", errors="surrogateescape")) > MAX_COMMAND_BYTES:
        raise SandboxSpecError("command", f"over {MAX_COMMAND_BYTES} bytes; put the script in "
                               "`files` and run it by name")
    timeout = spec.timeout_s
    if not isinstance(timeout, int | float) or not math.isfinite(timeout) or timeout <= 0:
        raise SandboxSpecError("timeout_s", "must be a positive, finite number of seconds")
    if timeout > MAX_TIMEOUT_S:
        raise SandboxSpecError("timeout_s", f"at most {MAX_TIMEOUT_S:.0f} s")
    validate_cores(spec.cores, available_cores)
    validate_env(spec.env)
    units = spec.env.get(UNITS_ENV)
    if units is not None and not (units.isdigit() and int(units) >= 1):
        raise SandboxSpecError(f"env[{UNITS_ENV!r}]", "must be a positive integer (or unset: "
                               "it defaults to len(cores))")
    if spec.stdin is not None:
        if not isinstance(spec.stdin, str):
            raise SandboxSpecError("stdin", "must be text (str) or None")
        if len(spec.stdin.encode("utf-8", errors="surrogateescape")) > limits.file_size_mb * MB:
            raise SandboxSpecError("stdin", f"over {limits.file_size_mb} MiB; ship it as a file")
    return validate_files(spec.files, limits)


def sandbox_env(spec: ExecSpec, base: Mapping[str, str]) -> dict[str, str]:
    """The command's environment: ``base``, then the spec's extras, and ``TANGRAM_UNITS``.

    ``TANGRAM_UNITS`` is ``len(spec.cores)`` unless the spec's env sets it explicitly (a caller
    that pins several logical units to fewer CPUs passes the unit count that way).
    """
    env = dict(base)
    env.update(validate_env(spec.env))
    env.setdefault(UNITS_ENV, str(len(spec.cores)))
    return env


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def owner_tag(prefix: str) -> str:
    """A unique name for something this process owns: ``<prefix><pidns>-<pid>-<random>``.

    :func:`is_stale_tag` recognises it once its process is gone, so leftovers of a crashed worker
    can be removed by the next one (only within the same pid namespace, where the pid means
    something).
    """
    return f"{prefix}{_pid_namespace()}-{os.getpid()}-{secrets.token_hex(4)}"


def is_stale_tag(name: str, prefix: str) -> bool:
    """Whether ``name`` is an :func:`owner_tag` of a dead process in this pid namespace."""
    if not name.startswith(prefix):
        return False
    fields = name[len(prefix):].split("-")
    if len(fields) != 3 or not fields[0].isdigit() or not fields[1].isdigit():
        return False
    if int(fields[0]) != _pid_namespace() or int(fields[1]) == os.getpid():
        return False
    try:
        os.kill(int(fields[1]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def workdir_name(trajectory_id: str) -> str:
    """A file-system-safe, collision-resistant directory name for a trajectory id."""
    digest = hashlib.sha256(validate_trajectory_id(trajectory_id).encode()).hexdigest()
    return f"t-{digest[:40]}"


# ---------------------------------------------------------------------------------------------
# Work-dir files


def _open_dir_at(parent_fd: int, name: str, uid: int, gid: int, where: str) -> int:
    """Open (creating if needed) a sub-directory without following symlinks."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, dir_fd=parent_fd)
    except FileNotFoundError:
        pass
    except (NotADirectoryError, OSError) as exc:
        raise SandboxSpecError(where, f"{name!r} exists in the work dir and is not a directory "
                               f"({exc.strerror}); pick another path") from exc
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o755, dir_fd=parent_fd)
    fd = os.open(name, flags, dir_fd=parent_fd)
    os.fchown(fd, uid, gid)
    return fd


def _write_file_at(dir_fd: int, name: str, data: bytes, uid: int, gid: int, where: str) -> None:
    """Replace ``name`` in ``dir_fd`` with a fresh regular file holding ``data``.

    Whatever was there (a symlink planted by the sandbox, a hard link, a FIFO) is unlinked first,
    so the write can never land outside the work dir.
    """
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise SandboxSpecError(where, f"{name!r} is a directory in the work dir; "
                                   "pick another path")
        os.unlink(name, dir_fd=dir_fd)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, 0o644, dir_fd=dir_fd)
    try:
        os.fchown(fd, uid, gid)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
    finally:
        os.close(fd)


def write_files(workdir: Path, files: list[SpecFile], uid: int, gid: int) -> None:
    """Write validated spec files into ``workdir``, owned by ``uid:gid``, never via symlinks."""
    root_fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for spec_file in files:
            where = f"files[{spec_file.name!r}]"
            fds: list[int] = []
            try:
                dir_fd = root_fd
                for part in spec_file.parts[:-1]:
                    dir_fd = _open_dir_at(dir_fd, part, uid, gid, where)
                    fds.append(dir_fd)
                _write_file_at(dir_fd, spec_file.parts[-1], spec_file.data, uid, gid, where)
            finally:
                for fd in fds:
                    os.close(fd)
    finally:
        os.close(root_fd)


def _walk_sizes(path: str) -> Iterator[int]:
    """Yield the allocated bytes of every entry below ``path``, never following symlinks."""
    try:
        entries = list(os.scandir(path))
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        yield max(st.st_blocks * 512, 512)
        if stat.S_ISDIR(st.st_mode):
            yield from _walk_sizes(entry.path)


def dir_usage(path: Path, stop_above: int | None = None) -> int:
    """Disk usage of a directory tree in bytes (each entry counts at least 512 bytes).

    Stops counting once the total passes ``stop_above``, so a huge tree costs little to reject.
    """
    total = 0
    for size in _walk_sizes(str(path)):
        total += size
        if stop_above is not None and total > stop_above:
            break
    return total


# ---------------------------------------------------------------------------------------------
# Output pumping


class Sink(Protocol):
    """Receives a stream's bytes as they arrive."""

    def feed(self, chunk: bytes, now: float) -> None:
        """Take one chunk read at time ``now``."""
        ...


@dataclass
class CappedBuffer:
    """Keeps the first ``cap`` bytes of a stream and counts the rest."""

    cap: int
    data: bytearray = field(default_factory=bytearray)
    total: int = 0

    def feed(self, chunk: bytes, now: float) -> None:
        """Keep what fits under the cap, count everything."""
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        self.total += len(chunk)

    @property
    def truncated(self) -> bool:
        """Whether bytes were dropped."""
        return self.total > self.cap

    def text(self) -> str:
        """The kept bytes, decoded as UTF-8 with replacement characters."""
        return self.data.decode("utf-8", errors="replace")


@dataclass
class ReadyMarker:
    """Strips a start marker from the head of a stream and records when it arrived.

    A backend makes its in-sandbox wrapper print ``marker`` just before it execs the user's
    command: bytes before the marker are setup noise (kept in ``preamble`` for error messages),
    bytes after it go to ``inner``.
    """

    marker: bytes
    inner: Sink
    preamble: bytearray = field(default_factory=bytearray)
    ready_at: float | None = None
    max_preamble: int = 65536

    def feed(self, chunk: bytes, now: float) -> None:
        """Look for the marker until found, then forward everything."""
        if self.ready_at is not None:
            self.inner.feed(chunk, now)
            return
        self.preamble += chunk
        idx = self.preamble.find(self.marker)
        if idx >= 0:
            self.ready_at = now
            rest = bytes(self.preamble[idx + len(self.marker):])
            del self.preamble[idx:]
            if rest:
                self.inner.feed(rest, now)
        elif len(self.preamble) > self.max_preamble:
            del self.preamble[: len(self.preamble) - self.max_preamble]


def pump(
    proc: subprocess.Popen[bytes],
    sinks: Mapping[int, Sink],
    stdin_data: bytes | None,
    deadline: float,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Feed ``proc``'s stdin and drain its stdout/stderr into ``sinks`` until EOF or ``deadline``.

    ``sinks`` maps 1 (stdout) and 2 (stderr) to sinks. Reading continues past any cap so a chatty
    command never blocks on a full pipe. Returns True when both streams reached EOF in time.
    """
    streams = {1: proc.stdout, 2: proc.stderr}
    with selectors.DefaultSelector() as sel:
        for index, stream in streams.items():
            if stream is not None:
                sel.register(stream.fileno(), selectors.EVENT_READ, index)
        pending = memoryview(stdin_data) if stdin_data else None
        if proc.stdin is not None:
            if pending is None:
                proc.stdin.close()
            else:
                os.set_blocking(proc.stdin.fileno(), False)
                sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE, 0)
        readers = sum(1 for s in streams.values() if s is not None)
        while readers:
            remaining = deadline - clock()
            if remaining <= 0:
                return False
            for key, _ in sel.select(min(remaining, 1.0)):
                if key.data == 0:
                    pending = _write_some(proc, sel, pending)
                    continue
                chunk = os.read(key.fd, 65536)
                if chunk:
                    sinks[key.data].feed(chunk, clock())
                else:
                    sel.unregister(key.fd)
                    readers -= 1
        if proc.stdin is not None and not proc.stdin.closed:
            sel.unregister(proc.stdin.fileno())
            proc.stdin.close()
    return True


def _write_some(
    proc: subprocess.Popen[bytes], sel: selectors.BaseSelector, pending: memoryview | None
) -> memoryview | None:
    """Write what the stdin pipe takes now; close it when done or when the reader went away."""
    assert proc.stdin is not None
    try:
        written = os.write(proc.stdin.fileno(), pending) if pending else 0
    except BlockingIOError:
        return pending
    except (BrokenPipeError, OSError):
        written = len(pending) if pending else 0
    rest = pending[written:] if pending else None
    if not rest:
        sel.unregister(proc.stdin.fileno())
        proc.stdin.close()
        return None
    return rest


# ---------------------------------------------------------------------------------------------
# Elastic commands

_CMD_START = r"(?:^|(?<=[;&|(\n]))"
_ASSIGNMENTS = r"(?:\s*[A-Za-z_][A-Za-z0-9_]*=\S*)*"
_PYTEST = (
    r"(?:\S*/)?python(?:3(?:\.\d+)?)?\s+-m\s+pytest"
    r"|(?:\S*/)?py\.?test"
)
_INVOCATION_RE = re.compile(
    _CMD_START + r"(?P<head>" + _ASSIGNMENTS + r"\s*(?:" + _PYTEST + r"))(?=$|[\s;&|)])"
)
_SIMPLE_END_RE = re.compile(r"[;&|)\n]")


def _has_explicit_workers(args: str) -> bool:
    """Whether pytest arguments already choose the worker count or disable xdist."""
    for token in args.split():
        if token == "-n" or token.startswith("--numprocesses") or token == "no:xdist":  # nosec B105 # pytest arguments, not passwords
            return True
        if token.startswith("-n") and (token[2:3].isdigit() or token[2:3] in ("a", "l", "=")):
            return True
        if token == "-pno:xdist":  # nosec B105 # a pytest argument, not a password
            return True
    return False


def rewrite_parallelism(command: str, units: int) -> str:
    """Tell elastic commands their parallelism: ``pytest ...`` becomes ``pytest -n <units> ...``.

    Rewrites every ``pytest`` / ``py.test`` / ``python[3[.x]] -m pytest`` invocation at a command
    position (start, or after ``;``, ``&``, ``|``, ``(`` or a newline; leading ``VAR=value``
    assignments allowed). Invocations that already pass ``-n``/``--numprocesses`` or disable xdist
    (``-p no:xdist``) are left alone, and so is everything when ``units`` is 1. Pure function.
    """
    if units < 1:
        raise ValueError(f"units must be >= 1, got {units}")
    if units == 1:
        return command
    out: list[str] = []
    pos = 0
    for match in _INVOCATION_RE.finditer(command):
        end = match.end("head")
        tail_end = _SIMPLE_END_RE.search(command, end)
        args = command[end: tail_end.start() if tail_end else len(command)]
        out.append(command[pos:end])
        if not _has_explicit_workers(args):
            out.append(f" -n {units}")
        pos = end
    out.append(command[pos:])
    return "".join(out)
