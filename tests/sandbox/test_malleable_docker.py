"""The node resizes a malleable test run inside a real Docker container: the container's cpuset
narrows at once and widens first, the run's control socket (in the container's tmpfs work dir)
is reached through ``docker exec``, and the verdict is pytest's. Steps are ordered by a gate
file in the container, never by timing."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from malleable_runs import malleable_args, verdict_of
from test_malleable_sandbox import AFFINITY_SUITE

from tangram_celery.sandbox import ExecSpec
from tangram_celery.sandbox.docker import DockerBackend
from tangram_celery.sandbox.malleable import CoreResizer, runner_files

pytestmark = pytest.mark.slow

RUNNER = ".runner"


def in_container(backend: DockerBackend, tid: str, argv: list[str]) -> str:
    """Run ``argv`` in the trajectory's container as its sandbox uid (the test's own look)."""
    env = backend._pool.get(tid)
    assert env is not None and env.box is not None
    code, out = env.box.container.exec_run(argv, user=str(env.box.uid))
    assert code == 0, out
    return str(out.decode())


def records(backend: DockerBackend, tid: str) -> list[tuple[str, str, frozenset[int]]]:
    found = []
    for line in in_container(backend, tid, ["sh", "-c", "cat /work/log 2>/dev/null || true"]
                             ).splitlines():
        pid, name, cores = line.split()
        found.append((pid, name, frozenset(int(c) for c in cores.split(",") if c)))
    return found


def until(check: Callable[[], Any], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_the_node_shrinks_and_grows_a_run_in_a_container(
        docker_backend: DockerBackend, two_cores: tuple[int, int]) -> None:
    first, second = two_cores
    tid = f"md-{uuid.uuid4().hex[:8]}"
    command = (f"PYTHONPATH=/work/{RUNNER} python3 -m pytest -q -p no:cacheprovider "
               f"{' '.join(malleable_args(2, '--malleable-control=/work/control.sock'))}"
               " suite")
    spec = ExecSpec(tid, command, {**runner_files(RUNNER), "suite/test_cores.py": AFFINITY_SUITE},
                    120.0, two_cores)
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            running = pool.submit(docker_backend.run, spec)
            until(lambda: running.done() or docker_backend.run_control(tid, "control.sock"),
                  "the action to start")
            until(lambda: running.done() or len({p for p, _, _ in records(docker_backend, tid)})
                  == 2, "both workers")
            control = docker_backend.run_control(tid, "control.sock")
            assert control is not None
            assert control("status", 10.0)["workers"] == 2
            resizer = CoreResizer(docker_backend, tid, two_cores, control)
            assert resizer.take() == second
            assert in_container(docker_backend, tid, [
                "python3", "-c", "import os; print(sorted(os.sched_getaffinity(0)))"
            ]).strip() == f"[{first}]", "the container left the core at once"
            assert resizer.retire()
            shrunk = len(records(docker_backend, tid))
            assert resizer.grow(second)
            assert resizer.cores == (first, second)
            until(lambda: len({p for p, _, _ in records(docker_backend, tid)}) == 3,
                  "the new worker")
            in_container(docker_backend, tid, ["touch", "/work/gate"])
            outcome = running.result(timeout=120)
        seen = records(docker_backend, tid)
        assert not docker_backend.repin(tid, (first, second), (first,)), "nothing runs now"
        assert docker_backend.run_control(tid, "control.sock") is None
    finally:
        docker_backend.end_trajectory(tid)
    assert verdict_of(outcome.stdout, outcome.exit_code or 0).counts == {"passed": 13}, (
        outcome.stdout + outcome.stderr)
    before = {pid for pid, _, _ in seen[:shrunk]}
    newest = {pid for pid, _, _ in seen[shrunk:]} - before
    assert newest, seen
    assert {cores for pid, _, cores in seen if pid in newest} == {frozenset({first, second})}, (
        "every worker started after the grow runs on both cores", seen)
