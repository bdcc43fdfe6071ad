"""A real CPU node on the Docker backend resizes its malleable test runs while they run: a run
that holds both cores of the node gives one back at once to an exec action that arrives, and
grows onto it again when the exec action ends. Real Redis, real containers, the node in this
process; the order comes from a gate file in the run's container, never from timing."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker_engine
import pytest
from test_malleable_node import WAIT_S, malleable_run, wait_for

from tangram_celery.client import command_action
from tangram_celery.pools.cpu_pool import CpuNode
from tangram_celery.pools.registry import Registry
from tangram_celery.sandbox import SandboxLimits
from tangram_celery.sandbox.docker import DockerBackend, WarmPoolPolicy
from tangram_celery.settings import Settings

pytestmark = pytest.mark.slow



@pytest.fixture(scope="module")
def docker() -> Iterator[DockerBackend]:
    """A Docker backend on a real engine holding the sandbox image."""
    with docker_engine.engine_with_sandbox_image("malleable node") as url:
        backend = DockerBackend(Path("/var/tmp/tangram-mall-docker"), SandboxLimits(memory_mb=512),
                                docker_url=url, warm_pool=WarmPoolPolicy(min_size=2, max_size=3))
        try:
            yield backend
        finally:
            backend.close()


def in_container(backend: DockerBackend, tid: str, script: str) -> str:
    """``sh -c script`` in the trajectory's container as its sandbox uid (the test's look)."""
    env = backend._pool.get(tid)
    if env is None or env.box is None:
        return ""
    code, out = env.box.container.exec_run(["sh", "-c", script], user=str(env.box.uid))
    return str(out.decode()) if code == 0 else ""


def test_a_docker_node_takes_a_core_from_a_run_for_an_exec_action_and_gives_it_back(
        settings: Settings, registry: Registry, docker: DockerBackend,
        two_cores: tuple[int, int]) -> None:
    node_settings = dataclasses.replace(settings, node=dataclasses.replace(
        settings.node, scheduler="fcfs-min", malleable_start_s=0.1, malleable_tick_s=0.2))
    name = f"ml-docker-{uuid.uuid4().hex[:6]}"
    node = CpuNode(node_settings, name, 2, list(two_cores), 1024.0, docker, registry)
    assert node.malleable is not None, "resizing is on by default and Docker can do it"
    run_tid, exec_tid = f"d-run-{uuid.uuid4().hex[:6]}", f"d-exec-{uuid.uuid4().hex[:6]}"
    node.start()
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            running = pool.submit(node.execute, malleable_run(run_tid).to_json(), time.time())
            wait_for(lambda: len({line.split()[0] for line in in_container(
                docker, run_tid, "cat /work/run-log 2>/dev/null").splitlines()}) == 2,
                "the run's two workers, one per core")
            exec_result = pool.submit(node.execute, command_action(
                exec_tid, "echo took-a-core").to_json(), time.time()).result(WAIT_S)
            assert not in_container(docker, run_tid, "ls /work/run-gate 2>/dev/null")
            wait_for(lambda: len({line.split()[0] for line in in_container(
                docker, run_tid, "cat /work/run-log").splitlines()}) >= 3,
                "a new worker on the core the exec action gave back")
            in_container(docker, run_tid, "touch /work/run-gate")
            result = running.result(WAIT_S)
    finally:
        node.stop()
        for tid in (run_tid, exec_tid):
            docker.end_trajectory(tid)
    assert exec_result["status"] == "ok" and "took-a-core" in exec_result["output"]["stdout"]
    assert result["status"] == "failed" and result["output"]["exit_code"] == 1
    assert "1 failed, 6 passed" in result["output"]["stdout"], result["output"]["stdout"]
    held = [r for r in registry.allocations(name) if r["action_id"] == result["action_id"]]
    (taken,) = exec_result["units"]
    assert any(taken in r["units"] for r in held), "the exec action ran on a core the run held"
    counts = [len(r["units"]) for r in held]
    shrunk = counts.index(1, counts.index(2))
    assert 2 in counts[shrunk:], ("grown, shrunk for the exec action, grown back", held)
