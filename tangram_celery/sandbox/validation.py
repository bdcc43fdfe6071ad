"""Exec-spec validation: trajectory ids, file paths and sizes, environment, cores and timeouts.

A backend checks every spec with :func:`validate_spec` before it touches anything, and builds
the command's environment with :func:`sandbox_env`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from tangram_celery.errors import SandboxSpecError
from tangram_celery.sandbox.base import MB, UNITS_ENV, ExecSpec, SandboxLimits

TRAJECTORY_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_FILES = 10_000
MAX_ENV_BYTES = 96 * 1024
MAX_COMMAND_BYTES = 96 * 1024
MAX_TIMEOUT_S = 24 * 3600.0


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

    Returns the spec's files, validated and encoded, ready for
    :func:`~tangram_celery.sandbox.workdir.write_files`.
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
    validate_memory(spec.memory_mb, limits)
    units = spec.env.get(UNITS_ENV)
    if units is not None and not (units.isdigit() and int(units) >= 1):
        raise SandboxSpecError(f"env[{UNITS_ENV!r}]", "must be a positive integer (or unset: "
                               "it defaults to len(cores))")
    if spec.stdin is not None:
        if not isinstance(spec.stdin, str):
            raise SandboxSpecError("stdin", "must be text (str) or None")
        if len(spec.stdin.encode("utf-8", errors="surrogateescape")) > limits.file_size_mb * MB:
            raise SandboxSpecError("stdin", f"over {limits.file_size_mb} MiB; ship it as a file")
    if spec.python is not None:
        split_relative_path(spec.python, "python")
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


def validate_memory(memory_mb: object, limits: SandboxLimits) -> None:
    """An action's own memory limit: None (the default) or 16 MiB up to the limits' ceiling."""
    if memory_mb is None:
        return
    if not isinstance(memory_mb, int) or isinstance(memory_mb, bool) or memory_mb < 16:
        raise SandboxSpecError("memory_mb", "must be a whole number of MiB, at least 16")
    if memory_mb > limits.ceiling_mb:
        raise SandboxSpecError("memory_mb", f"{memory_mb} MiB is over the {limits.ceiling_mb} "
                               "MiB this node gives one action; ask for less or run it on a "
                               "node with more memory")
