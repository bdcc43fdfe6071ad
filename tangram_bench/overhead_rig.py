"""What ``tangram bench overhead`` runs besides the cluster: the sandbox backends it calls
directly and the baseline server."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tangram_bench.baseline import start_baseline
from tangram_celery.errors import SandboxError
from tangram_celery.sandbox import SandboxLimits
from tangram_celery.sandbox.bwrap import BwrapBackend
from tangram_celery.sandbox.docker import DockerBackend
from tangram_celery.settings import SandboxSettings


@dataclass(frozen=True)
class Rig:
    """The direct backends (Docker's may be missing, with the reason), the baseline's URL and
    the core the direct probes run on."""

    bwrap: BwrapBackend
    docker: DockerBackend | None
    docker_error: str
    baseline_url: str
    core: int


@contextlib.contextmanager
def open_rig(sandbox: SandboxSettings, docker_url: str | None) -> Iterator[Rig]:
    """Start the baseline and the backends; remove everything afterwards."""
    root = Path(tempfile.mkdtemp(prefix="tangram-bench-overhead-", dir="/var/tmp"))  # nosec B108 # world-traversable parent for the sandbox uids
    root.chmod(0o755)
    core = min(os.sched_getaffinity(0))
    bwrap = BwrapBackend(root / "bwrap", SandboxLimits())
    docker, error = None, ""
    try:
        docker = DockerBackend(root / "docker", SandboxLimits(),
                               docker_url=docker_url or sandbox.docker_url)
    except SandboxError as exc:
        error = str(exc)
    try:
        with start_baseline() as baseline:
            yield Rig(bwrap, docker, error, baseline.url, core)
    finally:
        bwrap.close()
        if docker is not None:
            docker.close()
        shutil.rmtree(root, ignore_errors=True)
