"""The Docker actuator against a real Docker engine (a private dockerd when none answers)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import docker
import docker_engine
import pytest
import redis

from tangram_celery import keys
from tangram_celery.autoscale.actuators import ContainerTemplate, DockerActuator
from tangram_celery.errors import SandboxSetupError
from tangram_celery.sandbox.docker.image import DEFAULT_TAG, ensure_image

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def docker_client() -> Iterator[Any]:
    """A client of a running engine holding the sandbox image."""
    engine = docker_engine.acquire_for_tests("Docker actuator")
    client = docker.DockerClient(base_url=engine.url, timeout=300)
    try:
        try:
            ensure_image(client, DEFAULT_TAG)
        except SandboxSetupError as exc:
            pytest.fail(f"cannot build the sandbox image: {exc}")
        yield client
    finally:
        client.close()
        docker_engine.release(engine)


def test_docker_actuator_scales_labelled_containers_and_drains(
    docker_client: Any, redis_client: redis.Redis
) -> None:
    """Grow starts labelled containers; shrink drains (waits for the pinned trajectory), then
    stops and removes the container."""
    prefix = f"dk{uuid.uuid4().hex[:6]}"
    template = ContainerTemplate(DEFAULT_TAG, command=("sleep", "600"), network_mode="none",
                                 labels={"com.docker.compose.service": "cpu-node"},
                                 stop_timeout_s=1)
    actuator = DockerActuator(redis_client, docker_client, template, cores=1, memory_mb=1024,
                              prefix=prefix, drain_timeout_s=60)
    try:
        actuator.scale("cpu", 2)
        running = actuator.containers()
        assert len(running) == 2 and actuator.sizes() == {"cpu": 2}
        assert {c.labels["tangram.member"] for c in running} == {f"{prefix}-1", f"{prefix}-2"}
        redis_client.sadd(keys.node_trajectories(f"{prefix}-2"), "traj-1")
        redis_client.sadd(keys.node_trajectories(f"{prefix}-1"), "traj-2", "traj-3")
        actuator.scale("cpu", 1)
        assert actuator.sizes() == {"cpu": 1}
        assert [m.name for m in actuator.draining()] == [f"{prefix}-2"]
        assert redis_client.hget(keys.node(f"{prefix}-2"), "memory_mb") == b"0"
        actuator.step()
        assert len(actuator.containers()) == 2, "stopped before its trajectory ended"
        redis_client.srem(keys.node_trajectories(f"{prefix}-2"), "traj-1")
        actuator.step()
        assert [c.labels["tangram.member"] for c in actuator.containers()] == [f"{prefix}-1"]
        assert actuator.held.total(0) != 0
    finally:
        actuator.close()
    assert actuator.containers() == []
