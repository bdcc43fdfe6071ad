"""Shared fixtures: a private real Redis per session, settings pointing at it, real workers."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from tangram_celery.pools.launch import spawn_cpu_worker, wait_for_nodes
from tangram_celery.pools.registry import Registry
from tangram_celery.processes import stop_process
from tangram_celery.settings import Settings
from tangram_celery.stack.broker import embedded_redis


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A private redis-server on a free loopback port, for the whole session."""
    with embedded_redis() as server:
        yield server.url


@pytest.fixture()
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A client of the private Redis, flushed before each test."""
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    yield client
    client.close()


@pytest.fixture()
def settings(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """Settings for the private Redis and a fresh, world-traversable sandbox root."""
    root = Path("/var/tmp") / f"tangram-test-{uuid.uuid4().hex[:8]}"
    return Settings.from_env({}, redis_url=redis_url, sandbox_root=root,
                             node_heartbeat_s=0.5, node_ttl_s=3.0)


@pytest.fixture()
def registry(redis_client: redis.Redis, settings: Settings) -> Registry:
    """The node/pin registry over the private Redis."""
    return Registry(redis_client, settings.node.ttl_s, settings.actions.trajectory_ttl_s)


CpuWorkers = Callable[..., list[str]]


@pytest.fixture()
def cpu_workers(
    settings: Settings, registry: Registry, tmp_path: Path
) -> Iterator[CpuWorkers]:
    """Start real ``tangram worker cpu`` subprocesses: ``cpu_workers({"node-a": 2, ...})``."""
    started: list[object] = []

    def start(nodes: dict[str, int], **env: str) -> list[str]:
        base = {"TANGRAM_REDIS_URL": settings.broker.redis_url,
                "TANGRAM_SANDBOX_ROOT": str(settings.sandbox.root),
                "TANGRAM_NODE_HEARTBEAT_S": str(settings.node.heartbeat_s),
                "TANGRAM_NODE_TTL_S": str(settings.node.ttl_s), **env}
        for name, cores in nodes.items():
            started.append(spawn_cpu_worker(base, name, cores, tmp_path / f"{name}.log"))
        wait_for_nodes(registry, list(nodes))
        return list(nodes)

    yield start
    for process in started:
        stop_process(process)  # type: ignore[arg-type]
    for log in sorted(tmp_path.glob("*.log")):
        text = log.read_text(errors="replace")
        if "Traceback" in text:
            print(f"--- {log.name} ---\n{text[-4000:]}")
    with contextlib.suppress(OSError):
        os.rmdir(settings.sandbox.root)


@pytest.fixture(scope="session")
def triton_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real tritonserver (from nvidia-pytriton) on the repository's ``triton_models/``, on free
    loopback ports for the whole session, stopped at the end. Shared by the reward tests and the
    GPU pool tests. When the binary cannot start on a machine the fixture **fails** with the
    server's log: these tests never pass vacuously."""
    from tangram_celery.errors import ServiceError
    from tangram_celery.reward.server import TritonServer

    repository = Path(__file__).resolve().parents[1] / "triton_models"
    server = TritonServer(repository, workdir=tmp_path_factory.mktemp("triton"))
    try:
        server.start()
    except ServiceError as exc:
        pytest.fail(
            "the real tritonserver (nvidia-pytriton) could not start on this machine, so the "
            f"reward tests cannot run:\n{exc}",
            pytrace=False,
        )
    yield server
    server.stop()
    assert not server.running(), "tritonserver still running after stop()"


@pytest.fixture()
def two_cores() -> tuple[int, int]:
    """Two usable core ids; skips on single-core hardware."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs a machine with at least 2 cores")
    return cores[0], cores[1]
