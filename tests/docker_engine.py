"""A real Docker engine for the tests, and the sandbox image in it.

:func:`acquire` uses the engine that answers at the configured socket
(``TANGRAM_SANDBOX_DOCKER_URL``, else ``DOCKER_HOST``, else ``/var/run/docker.sock``); when none
answers it starts a private ``dockerd`` (its own data root, exec root, socket, pidfile and
config, ``--iptables=false --ip-forward=false --bridge=none``), shared by concurrent test
sessions; :func:`release` by the last of them stops it and puts the forwarding sysctls back as
they were. The data root persists under ``/var/tmp/tangram-dockerd`` so the sandbox image is
built once per machine.

Why it may not give an engine, as :class:`EngineUnavailable` with ``kind``:

- ``"setup"``: a package is missing or we are not root; the message says what to run.
- ``"kernel"``: the kernel lacks what containers need (namespaces, cgroups, seccomp).
- ``"start"``: dockerd did not come up; the message carries its log's tail.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import docker
import docker.errors
import requests.exceptions

DEFAULT_URL = "unix:///var/run/docker.sock"
BASE = Path("/var/tmp/tangram-dockerd")
SETUP_HINT = "run `bash scripts/run.sh setup` (it installs docker.io and debootstrap)"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
FORWARDING_SYSCTLS = (
    "/proc/sys/net/ipv4/ip_forward",
    "/proc/sys/net/ipv6/conf/all/forwarding",
    "/proc/sys/net/ipv6/conf/default/forwarding",
)
NAMESPACES = ("pid", "net", "mnt", "ipc", "uts")


class EngineUnavailable(Exception):
    """No engine for the tests; ``kind`` is ``setup``, ``kernel`` or ``start``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class Engine:
    """An engine the tests may use; ``users`` is held while we use our private dockerd."""

    url: str
    base: Path | None = None
    users: IO[bytes] | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)


def configured_url(environ: Mapping[str, str]) -> str:
    """The engine URL the tests try first."""
    return environ.get("TANGRAM_SANDBOX_DOCKER_URL") or environ.get("DOCKER_HOST") or DEFAULT_URL


def answers(url: str, timeout: float = 3.0) -> bool:
    """Whether an engine answers a ping at ``url`` within ``timeout``."""
    path = url.removeprefix("unix://") if url.startswith("unix://") else None
    if path is not None and not os.path.exists(path):
        return False
    try:
        client = docker.DockerClient(base_url=url, timeout=timeout)
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError):
        return False
    try:
        return bool(client.ping())
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError):
        return False
    finally:
        client.close()


def _controllers() -> set[str]:
    found: set[str] = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cgroups").read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 4 and fields[3] == "1":
                found.add(fields[0])
    return found


def kernel_gaps() -> list[str]:
    """What this kernel lacks for containers (empty when nothing is missing)."""
    gaps = [f"{ns} namespaces" for ns in NAMESPACES if not os.path.exists(f"/proc/self/ns/{ns}")]
    missing = {"memory", "pids", "cpuset"} - _controllers()
    if missing:
        gaps.append(f"cgroup controllers {sorted(missing)}")
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        status = ""
    if "Seccomp:" not in status:
        gaps.append("seccomp")
    return gaps


def _storage_driver() -> str:
    try:
        filesystems = Path("/proc/filesystems").read_text()
    except OSError:
        filesystems = ""
    if "overlay" in filesystems or subprocess.run(["modprobe", "-q", "overlay"],
                                                  capture_output=True, check=False).returncode == 0:
        return "overlay2"
    return "vfs"


def _read_sysctls() -> dict[str, str]:
    values = {}
    for path in FORWARDING_SYSCTLS:
        with contextlib.suppress(OSError):
            values[path] = Path(path).read_text().strip()
    return values


def _restore_sysctls(saved: Mapping[str, str]) -> None:
    for path, value in saved.items():
        with contextlib.suppress(OSError):
            if Path(path).read_text().strip() != value:
                Path(path).write_text(value + "\n")


def dockerd_argv(dockerd: str, base: Path, driver: str) -> list[str]:
    """The private daemon's command line: nothing shared with a system dockerd."""
    return [
        dockerd,
        f"--data-root={base / 'data'}",
        f"--exec-root={base / 'exec'}",
        f"--host=unix://{base / 'docker.sock'}",
        f"--pidfile={base / 'docker.pid'}",
        f"--config-file={base / 'daemon.json'}",
        f"--storage-driver={driver}",
        "--iptables=false",
        "--ip-forward=false",
        "--ip-masq=false",
        "--bridge=none",
    ]


def _dockerd_pid(base: Path) -> int | None:
    """The pid in the private dockerd's pidfile, if that process is alive (not a zombie)."""
    try:
        pid = int((base / "docker.pid").read_text().strip())
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError, IndexError):
        return None
    return None if state in ("Z", "X") else pid


def _log_tail(log: Path, size: int = 3000) -> str:
    with contextlib.suppress(OSError):
        return log.read_text(errors="replace")[-size:]
    return ""


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (serializes starting and stopping the engine)."""
    with open(path, "wb") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def start_dockerd(base: Path = BASE) -> Engine:
    """Use the private dockerd under ``base``, starting it if no session runs it yet.

    Concurrent test sessions share it: each holds a shared lock on ``base/users`` while it
    uses the engine, and the last one to leave stops it (:func:`release`).
    """
    dockerd = shutil.which("dockerd") or shutil.which("dockerd", path="/usr/sbin:/usr/bin")
    if dockerd is None:
        raise EngineUnavailable("setup", f"docker.io is not installed (no dockerd); {SETUP_HINT}")
    if os.geteuid() != 0:
        raise EngineUnavailable("setup", "starting dockerd for the tests needs root; run them "
                                "as root or set TANGRAM_SANDBOX_DOCKER_URL to a running engine")
    gaps = kernel_gaps()
    if gaps:
        raise EngineUnavailable("kernel", f"this kernel lacks {', '.join(gaps)}")
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    engine = Engine(f"unix://{base / 'docker.sock'}", base=base)
    with _exclusive(base / "start.lock"):
        engine.users = open(base / "users", "ab")  # noqa: SIM115 - held until release()
        fcntl.flock(engine.users, fcntl.LOCK_SH)
        if answers(engine.url):
            return engine
        try:
            engine.process = _spawn(dockerd, base)
            return _wait_for(engine, time.monotonic() + START_TIMEOUT_S)
        except EngineUnavailable:
            _stop(engine)
            raise


def _spawn(dockerd: str, base: Path) -> subprocess.Popen[bytes]:
    """Start dockerd detached, after saving the sysctls it could change."""
    pid = _dockerd_pid(base)
    if pid is not None:
        raise EngineUnavailable(
            "start", f"a dockerd (pid {pid}) holds {base / 'docker.pid'} but does not answer on "
            f"{base / 'docker.sock'}; stop it and run the tests again")
    (base / "docker.pid").unlink(missing_ok=True)
    (base / "daemon.json").write_text("{}\n")
    (base / "sysctls.json").write_text(json.dumps(_read_sysctls()))
    with open(base / "dockerd.log", "ab") as out:
        return subprocess.Popen(
            dockerd_argv(dockerd, base, _storage_driver()), stdin=subprocess.DEVNULL,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"})


def _wait_for(engine: Engine, deadline: float) -> Engine:
    log = engine.base / "dockerd.log" if engine.base else None
    while time.monotonic() < deadline:
        if answers(engine.url, timeout=2.0):
            return engine
        if engine.process is not None and engine.process.poll() is not None:
            tail = _log_tail(log) if log else ""
            raise EngineUnavailable("start",
                                    f"dockerd exited with {engine.process.returncode}: {tail}")
        time.sleep(0.2)
    tail = _log_tail(log) if log else ""
    raise EngineUnavailable("start", f"no engine answered at {engine.url} within "
                            f"{START_TIMEOUT_S:.0f} s: {tail}")


def acquire(environ: Mapping[str, str] | None = None) -> Engine:
    """An engine for the tests: the configured one if it answers, else the private dockerd."""
    url = configured_url(os.environ if environ is None else environ)
    if answers(url):
        return Engine(url)
    return start_dockerd()


def release(engine: Engine) -> None:
    """Leave the engine; the last session using the private dockerd stops it and restores the
    forwarding sysctls saved when it started."""
    if engine.base is None or engine.users is None:
        return
    with _exclusive(engine.base / "start.lock"):
        fcntl.flock(engine.users, fcntl.LOCK_UN)
        try:
            fcntl.flock(engine.users, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another session still uses it
            engine.users.close()
            return
        _stop(engine)
        engine.users.close()


def _stop(engine: Engine) -> None:
    """SIGTERM the private dockerd (SIGKILL after a while); put the sysctls back."""
    assert engine.base is not None
    pid = _dockerd_pid(engine.base)
    if pid is None and engine.process is not None and engine.process.poll() is None:
        pid = engine.process.pid
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while _alive(pid, engine) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid, engine):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    if engine.process is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            engine.process.wait(timeout=STOP_TIMEOUT_S)
    with contextlib.suppress(OSError, ValueError):
        _restore_sysctls(json.loads((engine.base / "sysctls.json").read_text()))


def _alive(pid: int, engine: Engine) -> bool:
    if engine.process is not None and engine.process.pid == pid:
        return engine.process.poll() is None
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def acquire_for_tests(purpose: str) -> Engine:
    """An engine for ``purpose``'s tests; skips only where the kernel lacks what Docker needs
    (namespaces, cgroups, seccomp) outside CI, and fails otherwise with what to do."""
    import os

    import pytest

    try:
        return acquire()
    except EngineUnavailable as exc:
        if exc.kind == "kernel" and not os.environ.get("CI"):
            pytest.skip(f"this machine's kernel cannot run a Docker engine: {exc}")
        pytest.fail(f"no Docker engine for the {purpose} tests: {exc}")


@contextlib.contextmanager
def engine_with_sandbox_image(purpose: str) -> Iterator[str]:
    """The URL of an engine (as :func:`acquire_for_tests`) holding the sandbox image; the test
    fails, naming the cause, when the image cannot be built."""
    import pytest

    from tangram_celery.errors import SandboxSetupError
    from tangram_celery.sandbox.docker.image import DEFAULT_TAG, ensure_image

    engine = acquire_for_tests(purpose)
    try:
        client = docker.DockerClient(base_url=engine.url, timeout=300)
        try:
            ensure_image(client, DEFAULT_TAG)
        except SandboxSetupError as exc:
            pytest.fail(f"cannot build the sandbox image: {exc}")
        finally:
            client.close()
        yield engine.url
    finally:
        release(engine)
