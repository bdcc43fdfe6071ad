"""A host uid per trajectory on the docker backend, against a real engine.

Each trajectory's container runs its actions as a uid of its own from the host's uid pool (the
one the embedded backend takes its uids from), owns its ``/work`` with it, and gives it back when
the container is removed. Two trajectories' actions run as different host uids, so one that got
out of its container (as its uid) could neither signal the other's processes nor read its files:
the test plays that escapee on the host, as the first trajectory's uid, against a running action
of the second, and checks that the same probe, as the second's own uid, does reach it.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tangram_celery.errors import SandboxError
from tangram_celery.sandbox import ExecSpec
from tangram_celery.sandbox.docker import DockerBackend, DockerExecOutcome
from tangram_celery.sandbox.docker.pool import LABEL_UID

pytestmark = pytest.mark.slow

PROBE = """
import os, sys
pid = int(sys.argv[1])
try:
    os.kill(pid, 0)
    print("signal:ok")
except OSError as exc:
    print(f"signal:{type(exc).__name__}")
try:
    print("read:" + open(f"/proc/{pid}/root/work/secret.txt").read().strip())
except OSError as exc:
    print(f"read:{type(exc).__name__}")
"""


@pytest.fixture()
def dock(docker_backend: DockerBackend) -> Iterator[DockerBackend]:
    """The session's Docker backend; the test's trajectories end with it."""
    yield docker_backend
    for trajectory_id in docker_backend.trajectories():
        docker_backend.end_trajectory(trajectory_id)


def go(backend: DockerBackend, command: str, tid: str, **kw: Any) -> DockerExecOutcome:
    outcome = backend.run(ExecSpec(tid, command, {}, kw.pop("timeout_s", 20.0), (0,), **kw))
    assert isinstance(outcome, DockerExecOutcome)
    return outcome


def host_pids(uid: int, command: bytes) -> list[int]:
    """Host processes whose real uid is ``uid`` and whose command line starts with ``command``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        real = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1]
        if int(real) == uid and cmdline.startswith(command):
            found.append(int(entry.name))
    return found


def probe_as(uid: int, pid: int) -> list[str]:
    """What a host process running as ``uid`` can do to process ``pid``."""
    done = subprocess.run(["/usr/bin/python3", "-I", "-c", PROBE, str(pid)], user=uid,
                          group=uid, extra_groups=[], cwd="/", capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_each_trajectory_runs_as_its_own_host_uid(dock: DockerBackend) -> None:
    uids = {}
    for tid in ("uid-a", "uid-b"):
        uid, owner, *uid_map = go(dock, "id -u; stat -c %u /work; cat /proc/self/uid_map",
                                  tid).stdout.split()
        uids[tid] = int(uid)
        assert int(owner) == uids[tid], "the trajectory's /work belongs to its uid"
        assert uid_map == ["0", "0", "4294967295"], "no user namespace: the uid is the host's"
        box = dock._pool._envs[tid].box
        assert box is not None and box.uid == uids[tid]
        assert box.container.labels[LABEL_UID] == str(uids[tid])
    assert uids["uid-a"] != uids["uid-b"]
    assert all(uid in dock.uids for uid in uids.values())
    assert go(dock, "id -u", "uid-a").stdout.strip() == str(uids["uid-a"]), "kept for its life"


def test_one_trajectory_cannot_signal_or_read_anothers_processes(dock: DockerBackend) -> None:
    uid_a = int(go(dock, "id -u", "cross-a").stdout)
    uid_b = int(go(dock, "id -u", "cross-b").stdout)
    def hold() -> None:
        with contextlib.suppress(SandboxError):  # ended below, while it runs
            go(dock, "echo private-to-b > secret.txt; exec sleep 15", "cross-b")

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        deadline = time.monotonic() + 10
        while not (found := host_pids(uid_b, b"sleep")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(found) == 1, found
        assert probe_as(uid_a, found[0]) == ["signal:PermissionError", "read:PermissionError"]
        assert probe_as(uid_b, found[0]) == ["signal:ok", "read:private-to-b"]
    finally:
        dock.end_trajectory("cross-b")
        holder.join(20)


def test_a_removed_containers_uid_goes_back_to_the_pool(dock: DockerBackend) -> None:
    uid = int(go(dock, "id -u", "recycle").stdout)
    assert uid in dock.uids._locks
    dock.end_trajectory("recycle")
    deadline = time.monotonic() + 20
    while uid in dock.uids._locks and time.monotonic() < deadline:
        time.sleep(0.05)
    assert uid not in dock.uids._locks
