"""Sandbox backends: where CPU actions run, one persistent work dir per trajectory.

Use :func:`make_backend` to get a backend by name; ``"bwrap"`` (the embedded bubblewrap backend)
is the only one so far. The interface (:class:`SandboxBackend`, :class:`ExecSpec`,
:class:`ExecOutcome`, :class:`SandboxLimits`) is backend-neutral.
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
from tangram_celery.sandbox.base import (
    UNITS_ENV,
    ExecOutcome,
    ExecSpec,
    SandboxBackend,
    SandboxLimits,
    rewrite_parallelism,
)

BACKENDS = ("bwrap", "docker")

__all__ = [
    "BACKENDS",
    "UNITS_ENV",
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
    ``bwrap_path``, ``uid_base``, ``uid_count``, ``cgroups``, ``seccomp``). ``"docker"`` is
    planned and raises :class:`SandboxSetupError` until it exists.
    """
    if name == "bwrap":
        from tangram_celery.sandbox.bwrap import BwrapBackend

        return BwrapBackend(Path(root_dir), limits, **kw)
    if name == "docker":
        raise SandboxSetupError(
            "the docker sandbox backend is not implemented yet; use sandbox backend 'bwrap' "
            "(TANGRAM_SANDBOX_BACKEND=bwrap)"
        )
    raise SandboxSetupError(f"unknown sandbox backend {name!r}; choose one of {list(BACKENDS)}")
