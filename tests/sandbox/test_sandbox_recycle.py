"""Recycled sandboxes: a one-request trajectory's sandbox is wiped and reused, and nothing one
request leaves (a process, a file in tmp, a module the warm interpreter would import, a signal
handler, an environment change, an IPC object) reaches the next one. Real bubblewrap, with
cgroups and a tmpfs work dir (``bwrap``) and without (``rlimits``); each backend keeps one
recycled sandbox and starts none ahead, so the second request gets the first one's sandbox."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SMALL_LIMITS

from tangram_celery.sandbox import ExecOutcome, ExecSpec
from tangram_celery.sandbox.bwrap import BwrapBackend
from tangram_celery.sandbox.bwrap.recycle import RecyclePool
from tangram_celery.sandbox.bwrap.trajectory import Trajectory


@pytest.fixture(params=["bwrap", "rlimits"])
def recycling(request: pytest.FixtureRequest, sandbox_tools: None,
              sandbox_root: Path) -> Iterator[BwrapBackend]:
    degraded = request.param == "rlimits"
    backend = BwrapBackend(sandbox_root, SMALL_LIMITS, ready=0, recycle=1,
                           cgroups=not degraded, workdir_tmpfs=not degraded,
                           enforce="best-effort" if degraded else "strict")
    try:
        yield backend
    finally:
        backend.close()


def one_request(backend: BwrapBackend, command: str, python: str | None = None,
                **kw: object) -> ExecOutcome:
    """One request in a leased sandbox; waits until the sandbox is wiped and back."""
    tid = f"req-{uuid.uuid4().hex[:8]}"
    files = {"main.py": command} if python else {}
    spec = ExecSpec(tid, "true" if python else command, files, 20.0, (0,), python=python,
                    **kw)  # type: ignore[arg-type]
    with backend.lease(tid):
        outcome = backend.run(spec)
    deadline = time.monotonic() + 15
    while backend.recycled.idle() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    return outcome


def pair(backend: BwrapBackend, first: str, then: str, **kw: object) -> ExecOutcome:
    """Run ``first`` then ``then`` as two requests; checks they shared one sandbox."""
    one_request(backend, first)
    before = backend.recycled.reused
    outcome = one_request(backend, then, **kw)
    assert backend.recycled.reused == before + 1, "the second request got a new sandbox"
    return outcome


def test_a_recycled_sandbox_serves_request_after_request(recycling: BwrapBackend) -> None:
    for n in range(4):
        out = one_request(recycling, f"echo {n}; cat", stdin="in")
        assert (out.exit_code, out.stdout) == (0, f"{n}\nin")
    assert recycling.recycled.reused == 3
    assert recycling.trajectories() == []


def test_a_leftover_process_is_gone(recycling: BwrapBackend) -> None:
    out = pair(recycling, "setsid sh -c 'exec sleep 300' >/dev/null 2>&1 < /dev/null &",
               "cat /proc/[0-9]*/comm")
    assert "sleep" not in out.stdout


def test_files_in_tmp_shm_and_the_work_dir_are_gone(recycling: BwrapBackend) -> None:
    out = pair(recycling,
               "echo s > /tmp/leak; echo s > /dev/shm/leak; echo s > leak; mkdir -p d/e; "
               "touch d/e/f; chmod 000 d/e d; chmod 777 /work",
               "ls -A /tmp /dev/shm /work; stat -c %a /work")
    assert "leak" not in out.stdout and " d\n" not in out.stdout, out.stdout
    assert out.stdout.rstrip().endswith("700")


def test_a_module_planted_for_the_warm_interpreter_is_gone(recycling: BwrapBackend) -> None:
    one_request(recycling, "echo 'LEAKED = True' > fractions.py; "
                           "mkdir -p /tmp/m && echo 'LEAKED = True' > /tmp/m/fractions.py")
    out = one_request(recycling, "import fractions as f\nprint(f.__file__, hasattr(f, 'LEAKED'))",
                      python="main.py")
    assert out.exit_code == 0, out.stderr
    assert out.stdout.strip().endswith("False") and out.stdout.startswith("/usr/lib/python3")


def test_a_signal_handler_planted_for_later_interpreters_is_gone(
        recycling: BwrapBackend) -> None:
    site = "/work/.local/lib/python3.11/site-packages"
    out = pair(recycling,
               f"mkdir -p {site} && printf 'import signal\\nsignal.signal(signal.SIGTERM, "
               f"signal.SIG_IGN)\\n' > {site}/usercustomize.py",
               "python3 -c 'import signal as s; print(s.getsignal(s.SIGTERM) == s.SIG_DFL)'")
    assert out.stdout.strip() == "True", out.stdout + out.stderr


def test_an_environment_change_is_gone(recycling: BwrapBackend) -> None:
    out = pair(recycling, "echo 'export LEAKED=yes' > .profile; cp .profile /tmp/.profile",
               "sh -lc 'echo ${LEAKED:-unset}'")
    assert out.stdout.strip() == "unset"


def test_system_v_ipc_objects_are_gone_and_posix_queues_refused(
        recycling: BwrapBackend) -> None:
    make = ("import ctypes\nlibc = ctypes.CDLL(None)\n"
            "print(libc.shmget(4242, 4096, 0o1600), libc.msgget(4243, 0o1600))\n")
    first = one_request(recycling, make, python="main.py")
    assert "-1" not in first.stdout, first.stdout
    out = one_request(recycling, "tail -n +2 /proc/sysvipc/shm /proc/sysvipc/msg | "
                                 "grep -c 4242 || true")
    assert out.stdout.strip() == "0"
    queue = one_request(recycling, "import ctypes\nlibc = ctypes.CDLL('librt.so.1', "
                                   "use_errno=True)\nprint(libc.mq_open(b'/q', 0o100, 0o600, "
                                   "None), ctypes.get_errno())", python="main.py")
    assert queue.stdout.split() == ["-1", "1"], queue.stdout + queue.stderr


def test_a_sandbox_that_cannot_be_wiped_is_destroyed() -> None:
    destroyed: list[Trajectory] = []
    pool = RecyclePool(2, lambda traj: traj.uid == 1, destroyed.append)
    clean, dirty = Trajectory("a", 1, Path("/a")), Trajectory("b", 2, Path("/b"))
    pool.give_back(clean)
    pool.give_back(dirty)
    pool.close()
    assert destroyed == [dirty, clean]
    assert pool.destroyed == 2


def test_an_ended_or_over_quota_sandbox_is_never_reused(recycling: BwrapBackend) -> None:
    tid = "req-ended"
    with recycling.lease(tid):
        recycling.run(ExecSpec(tid, "true", {}, 20.0, (0,)))
        recycling.end_trajectory(tid)
    deadline = time.monotonic() + 10
    while recycling.recycled.destroyed == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert recycling.recycled.destroyed == 1 and recycling.recycled.idle() == 0
