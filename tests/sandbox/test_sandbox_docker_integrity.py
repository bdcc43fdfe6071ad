"""The docker backend's resident executor holds against its own actions, on a real engine.

Each test is an attack that succeeds if the protection it names is missing: the resident runs
as another uid than the actions (signals, ``/proc/PID/fd``, ptrace even without seccomp), every
process of the sandbox uid is killed between actions (a leftover forging a later action's
output), and a resident that dies under an action answers ``sandbox_lost``. One more: an action
costs no Docker API call (the engine's event stream shows no exec after the container's first).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_sandbox_attacks import py
from test_sandbox_integrity import FORGER, VICTIM, assert_not_forged

from tangram_celery.errors import SandboxLostError
from tangram_celery.sandbox import ExecSpec, SandboxLimits
from tangram_celery.sandbox.docker import DockerBackend, DockerExecOutcome, WarmPoolPolicy

pytestmark = pytest.mark.slow

SMALL = SandboxLimits(memory_mb=256, pids=64, file_size_mb=8, workdir_mb=32, tmp_mb=16,
                      nofile=128, output_cap_bytes=4096)


@pytest.fixture(params=["seccomp", "no-seccomp"])
def dock(request: pytest.FixtureRequest, docker_url: str,
         sandbox_root: Path) -> Iterator[DockerBackend]:
    """A backend with its seccomp filter, and one without (what holds without it)."""
    backend = DockerBackend(sandbox_root, SMALL, docker_url=docker_url,
                            seccomp=request.param == "seccomp",
                            warm_pool=WarmPoolPolicy(min_size=0, max_size=0))
    try:
        yield backend
    finally:
        backend.close()


def go(backend: DockerBackend, command: str, tid: str = "i1", **kw: Any) -> DockerExecOutcome:
    kw.setdefault("timeout_s", 20.0)
    outcome = backend.run(ExecSpec(tid, command, kw.pop("files", {}), cores=(0,), **kw))
    assert isinstance(outcome, DockerExecOutcome)
    return outcome


def resident_pid(backend: DockerBackend, tid: str = "i1") -> int:
    box = backend._pool._envs[tid].box
    assert box is not None
    return box.resident.pid


def test_actions_cannot_signal_trace_or_reach_the_resident(dock: DockerBackend) -> None:
    go(dock, "echo kept > state.txt")
    pid = resident_pid(dock)
    attack = py(f"""
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP, signal.SIGINT):
    for target in ({pid}, 1):
        try:
            os.kill(target, sig)
            print("SIGNALLED", target, sig, flush=True)
        except OSError as exc:
            print("REFUSED", target, exc.errno, flush=True)
for name, req in (("ATTACH", 16), ("SEIZE", 0x4206)):
    print(name, libc.ptrace(req, {pid}, None, None), flush=True)
for fd in ("0", "1", "2"):
    try:
        with open("/proc/{pid}/fd/" + fd, "wb") as fh:
            fh.write(b"FORGED")
        print("OPENED", fd, flush=True)
    except OSError as exc:
        print("NO FD", fd, exc.errno, flush=True)
try:
    os.kill(-1, signal.SIGKILL)
except OSError:
    pass
""")
    out = go(dock, attack)
    assert "REFUSED" in out.stdout and "SIGNALLED" not in out.stdout, out.stdout + out.stderr
    assert "ATTACH -1" in out.stdout and "SEIZE -1" in out.stdout, out.stdout
    assert "OPENED" not in out.stdout, out.stdout
    after = go(dock, "cat state.txt")
    assert after.stdout == "kept\n" and not after.environment_replaced
    assert resident_pid(dock) == pid, "the resident was killed and replaced"


def test_a_leftover_process_cannot_forge_a_later_actions_output(dock: DockerBackend) -> None:
    assert "PLANTED" in go(dock, FORGER).stdout
    time.sleep(0.3)
    assert_not_forged(go(dock, VICTIM))


def test_a_dead_resident_gives_sandbox_lost_and_the_trajectory_goes_on(
    dock: DockerBackend,
) -> None:
    go(dock, "echo kept > state.txt")
    pid = resident_pid(dock)
    box = dock._pool._envs["i1"].box
    assert box is not None
    errors: list[BaseException] = []

    def long_action() -> None:
        try:
            go(dock, "sleep 20")
        except BaseException as exc:  # noqa: BLE001 # the test inspects it
            errors.append(exc)

    worker = threading.Thread(target=long_action)
    worker.start()
    time.sleep(1.0)
    killed = box.container.exec_run(["sh", "-c", f"kill -9 {pid}"], user="0:0")
    assert killed.exit_code == 0, killed.output
    worker.join(15)
    assert not worker.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], SandboxLostError), errors
    assert "sandbox_lost" in str(errors[0])
    after = go(dock, "ls state.txt 2>&1; echo next")
    assert after.environment_replaced and after.stdout.endswith("next\n")


def test_an_action_makes_no_docker_exec(dock: DockerBackend) -> None:
    go(dock, "true")
    box = dock._pool._envs["i1"].box
    assert box is not None
    time.sleep(1.1)
    since = time.time()
    for _ in range(5):
        assert go(dock, "echo $$").exit_code == 0
    until = time.time() + 1
    events = dock.client.events(since=since, until=until, decode=True,
                                filters={"container": box.container.id})
    execs = [e for e in events if str(e.get("status", "")).startswith("exec_")]
    assert execs == [], execs
