"""Fixtures for the sandbox tests: real backends with small limits, and host probes.

``backend``/``run`` are the embedded bubblewrap backend. ``sandbox``/``sandbox_run`` are
parametrized over every backend: ``bwrap`` always, ``docker`` against a real engine (the one
at the configured socket, else a private dockerd started for the session, see
``tests/docker_engine.py``) with the sandbox image built locally if missing.

Nothing here skips for a missing tool: without bubblewrap, docker.io, debootstrap or the Debian
pytest packages the tests fail and say which setup step to run. The docker tests skip only
when the kernel lacks what containers need, and never in CI (``CI`` set).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import docker_engine
import pytest

from tangram_celery.sandbox import ExecOutcome, ExecSpec, SandboxBackend, SandboxLimits
from tangram_celery.sandbox.bwrap import BwrapBackend
from tangram_celery.sandbox.docker import DockerBackend, WarmPoolPolicy

SETUP_HINT = (
    "run the README's test setup command (apt-get install -y bubblewrap python3-pytest "
    "python3-pytest-xdist)"
)
SMALL_LIMITS = SandboxLimits(
    memory_mb=256, pids=64, file_size_mb=8, workdir_mb=32, tmp_mb=16, nofile=128,
    output_cap_bytes=4096,
)

Run = Callable[..., ExecOutcome]


def _host_pids_with(token: str) -> list[int]:
    """Host pids whose command line contains ``token`` (never this test process)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if token.encode() in fh.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


@pytest.fixture(scope="session")
def sandbox_tools() -> None:
    """Fail (not skip) with a setup hint when a tool the sandbox needs is missing."""
    if shutil.which("bwrap") is None:
        pytest.fail(f"bubblewrap (bwrap) is not installed; {SETUP_HINT}")
    probe = subprocess.run(["/usr/bin/python3", "-c", "import pytest, xdist"],
                           capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.fail(f"the system python3 lacks pytest/pytest-xdist; {SETUP_HINT}")


@pytest.fixture()
def sandbox_root() -> Iterator[Path]:
    """A fresh sandbox root under /var/tmp (world-traversable), removed afterwards."""
    root = Path("/var/tmp") / f"tangram-sbx-test-{uuid.uuid4().hex[:10]}"
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture()
def backend(sandbox_tools: None, sandbox_root: Path) -> Iterator[BwrapBackend]:
    """A real bubblewrap backend with small limits; closed after the test."""
    b = BwrapBackend(sandbox_root, SMALL_LIMITS)
    try:
        yield b
    finally:
        b.close()


def runner(backend: SandboxBackend) -> Run:
    """``run(command, tid="t1", cores=(0,), timeout_s=20, files=None, **spec_fields)``."""

    def _run(
        command: str,
        tid: str = "t1",
        cores: tuple[int, ...] = (0,),
        timeout_s: float = 20.0,
        files: dict[str, str] | None = None,
        **kw: object,
    ) -> ExecOutcome:
        spec = ExecSpec(tid, command, files or {}, timeout_s, cores, **kw)  # type: ignore[arg-type]
        return backend.run(spec)

    return _run


@pytest.fixture()
def run(backend: BwrapBackend) -> Run:
    """``run(command, tid="t1", ...)`` in the bubblewrap ``backend``."""
    return runner(backend)


@pytest.fixture(scope="session")
def docker_url() -> Iterator[str]:
    """The URL of a running Docker engine holding the sandbox image, for the whole session."""
    with docker_engine.engine_with_sandbox_image("docker sandbox") as url:
        yield url


@pytest.fixture(scope="session")
def docker_backend(docker_url: str) -> Iterator[DockerBackend]:
    """One Docker backend with small limits for the session (tests end their trajectories)."""
    b = DockerBackend(Path("/var/tmp/tangram-sbx-docker"), SMALL_LIMITS, docker_url=docker_url,
                      warm_pool=WarmPoolPolicy(min_size=1, max_size=2))
    try:
        yield b
    finally:
        b.close()


@pytest.fixture(params=["bwrap", "rlimits", pytest.param("docker", marks=pytest.mark.slow)])
def sandbox(request: pytest.FixtureRequest, sandbox_root: Path) -> Iterator[SandboxBackend]:
    """Every enforcement mode this machine can run, in turn, with the small limits: ``bwrap``
    (root: cgroups, seccomp, a tmpfs work dir), ``rlimits`` (bubblewrap without cgroups or a
    tmpfs work dir, run best-effort, as a node without root or delegation runs) and ``docker``.
    Nothing of a test outlives it."""
    if request.param in ("bwrap", "rlimits"):
        request.getfixturevalue("sandbox_tools")
        degraded = request.param == "rlimits"
        bwrap = BwrapBackend(sandbox_root, SMALL_LIMITS, cgroups=not degraded,
                             workdir_tmpfs=not degraded,
                             enforce="best-effort" if degraded else "strict")
        try:
            yield bwrap
        finally:
            bwrap.close()
        return
    shared: DockerBackend = request.getfixturevalue("docker_backend")
    try:
        yield shared
    finally:
        for trajectory_id in shared.trajectories():
            shared.end_trajectory(trajectory_id)


@pytest.fixture()
def sandbox_run(sandbox: SandboxBackend) -> Run:
    """``sandbox_run(command, tid="t1", ...)`` in the ``sandbox`` backend."""
    return runner(sandbox)


@pytest.fixture()
def token() -> str:
    """A unique marker string for host-side probes."""
    return f"TGTOKEN{uuid.uuid4().hex[:12]}"


@pytest.fixture()
def host_pids_with() -> Callable[[str], list[int]]:
    """``host_pids_with(token)``: host pids whose command line contains ``token``."""
    return _host_pids_with


@pytest.fixture()
def assert_gone() -> Callable[[str], None]:
    """``assert_gone(token)``: fail if a host process carrying ``token`` outlives ~2 s."""

    def check(token: str, wait_s: float = 2.0) -> None:
        deadline = time.monotonic() + wait_s
        while _host_pids_with(token) and time.monotonic() < deadline:
            time.sleep(0.05)
        survivors = _host_pids_with(token)
        for pid in survivors:
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
        assert not survivors, f"sandboxed processes survived their action: {survivors}"

    return check


@pytest.fixture()
def limits(backend: BwrapBackend) -> SandboxLimits:
    """The limits of the ``backend`` fixture."""
    return backend.limits
