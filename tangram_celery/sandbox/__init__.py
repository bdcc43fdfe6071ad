"""Sandbox backends: where CPU actions run, one persistent work dir per trajectory.

Use :func:`make_backend` to get a backend by name: ``"bwrap"`` (the embedded bubblewrap backend,
the default) or ``"docker"`` (a container per trajectory, through a Docker engine). The
interface (:class:`SandboxBackend`, :class:`ExecSpec`, :class:`ExecOutcome`,
:class:`SandboxLimits`) is backend-neutral.

May import: the ground floor; the pools drive the backends, never the other way round.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tangram_celery.errors import (
    SandboxCapacityError,
    SandboxError,
    SandboxSetupError,
    SandboxSpecError,
    WorkdirQuotaError,
)
from tangram_celery.sandbox.base import ExecOutcome, ExecSpec, SandboxBackend, SandboxLimits
from tangram_celery.sandbox.parallelism import rewrite_parallelism

BACKENDS = ("bwrap", "docker")
# options of the embedded backend that mean nothing to the docker one (callers pass them to any)
BWRAP_ONLY_OPTIONS = frozenset(
    {"bwrap_path", "cgroups", "ready", "recycle", "enforce", "workdir_tmpfs"})

__all__ = [
    "BACKENDS",
    "ExecOutcome",
    "ExecSpec",
    "SandboxBackend",
    "SandboxCapacityError",
    "SandboxError",
    "SandboxLimits",
    "SandboxSetupError",
    "SandboxSpecError",
    "WorkdirQuotaError",
    "make_backend",
    "rewrite_parallelism",
]


def make_backend(name: str, root_dir: Path, limits: SandboxLimits, **kw: Any) -> SandboxBackend:
    """Create the sandbox backend called ``name`` with its work dirs under ``root_dir``.

    ``"bwrap"``: :class:`~tangram_celery.sandbox.bwrap.BwrapBackend` (keyword options:
    ``bwrap_path``, ``uid_base``, ``uid_count``, ``cgroups``, ``seccomp``, ``ready``,
    ``recycle``, ``enforce``, ``workdir_tmpfs``).
    ``"docker"``: :class:`~tangram_celery.sandbox.docker.DockerBackend` (keyword options:
    ``docker_url``, ``image``, ``idle_ttl_s``, ``warm_pool``, ``api_timeout_s``, ``grace_s``,
    ``seccomp``, ``direct_cpu``, ``uid_base``, ``uid_count``, ``uid_lock_dir``; the embedded
    backend's cgroup, ready and enforcement options are ignored; it always enforces cores,
    memory, pids and its work dir). It raises
    :class:`SandboxSetupError` (:class:`~tangram_celery.errors.SandboxEngineError` when no
    engine answers) with what to do next.
    """
    if name == "bwrap":
        from tangram_celery.sandbox.bwrap import BwrapBackend

        return BwrapBackend(Path(root_dir), limits, **kw)
    if name == "docker":
        from tangram_celery.sandbox.docker import DockerBackend

        options = {k: v for k, v in kw.items() if k not in BWRAP_ONLY_OPTIONS}
        return DockerBackend(Path(root_dir), limits, **options)
    raise SandboxSetupError(f"unknown sandbox backend {name!r}; choose one of {list(BACKENDS)}")
