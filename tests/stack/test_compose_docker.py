"""End to end on a real Docker engine: build the stack's images without a registry, bring up
``compose/docker-compose.yml`` with docker-compose, serve a mixed batch of CPU and reward actions
from the host through the client, see the tasks in Flower's API, tear everything down.

The engine is the one ``tests/docker_engine.py`` gives (a private ``dockerd`` where none runs);
the test skips only where the kernel cannot run Docker outside CI. Images are rebuilt only when
their inputs changed (a digest label), and the rootfs and wheels are cached on the machine, so a
warm run takes about a minute and a cold one a few.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker_engine
import pytest
import redis
from stack_batch import check_batch_results, flower_tasks, mixed_batch

from tangram_celery.client import TangramClient
from tangram_celery.pools.launch import wait_for_nodes
from tangram_celery.pools.registry import Registry
from tangram_celery.processes import free_ports
from tangram_celery.sandbox.docker.image import ensure_image
from tangram_celery.settings import Settings
from tangram_celery.stack.images import ensure_stack_image

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "compose" / "docker-compose.yml"
PUBLISHED = ("STACK_REDIS_PORT", "STACK_TRITON_HTTP_PORT", "STACK_TRITON_GRPC_PORT",
             "STACK_TRITON_METRICS_PORT", "STACK_FLOWER_PORT", "STACK_GATEWAY_PORT")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def compose_command() -> list[str]:
    """``docker-compose`` (Debian's 1.29) or ``docker compose`` where the plugin exists."""
    found = shutil.which("docker-compose")
    if found:
        return [found]
    docker_cli = shutil.which("docker")
    if docker_cli and subprocess.run([docker_cli, "compose", "version"], capture_output=True,
                                     check=False).returncode == 0:
        return [docker_cli, "compose"]
    pytest.fail("neither docker-compose nor the docker compose plugin is installed; run "
                "`bash scripts/run.sh setup` (it installs Debian's docker-compose)")


@pytest.fixture(scope="module")
def engine() -> Iterator[docker_engine.Engine]:
    """A Docker engine for this module's tests."""
    acquired = docker_engine.acquire_for_tests("compose stack")
    try:
        yield acquired
    finally:
        docker_engine.release(acquired)


class ComposeProject:
    """One docker-compose project of the stack on its own ports and env file."""

    def __init__(self, engine_url: str, tmp_path: Path) -> None:
        if not engine_url.startswith("unix://"):
            pytest.fail(f"the compose test needs an engine on a unix socket, not {engine_url}")
        self.name = f"tgstack{uuid.uuid4().hex[:8]}"
        self.node = f"node-{self.name}"
        self.ports = dict(zip(PUBLISHED, free_ports(len(PUBLISHED)), strict=True))
        self.redis_password = secrets.token_urlsafe(18)
        self.flower_password = secrets.token_urlsafe(18)
        self.gateway_token = secrets.token_urlsafe(18)
        self.triton_key = secrets.token_urlsafe(18)
        self.env_file = tmp_path / "stack.env"
        values = {
            "STACK_REDIS_PASSWORD": self.redis_password,
            "TANGRAM_FLOWER_PASSWORD": self.flower_password,
            "TANGRAM_GATEWAY_TOKEN": self.gateway_token,
            "TANGRAM_TRITON_KEY": self.triton_key,
            "STACK_DOCKER_SOCKET": engine_url.removeprefix("unix://"),
            "STACK_ENV_FILE": str(self.env_file),
            "STACK_CPU_NODE": self.node,
            "TANGRAM_NODE_HEARTBEAT_S": "0.5",
            "TANGRAM_NODE_TTL_S": "3",
            **{k: str(v) for k, v in self.ports.items()},
        }
        self.env_file.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
        self.env = {"DOCKER_HOST": engine_url, "PATH": "/usr/local/bin:/usr/bin:/bin",
                    "HOME": str(tmp_path)}

    def run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """Run a compose subcommand on this project; fails the test on a non-zero exit."""
        argv = [*compose_command(), "-p", self.name, "-f", str(COMPOSE_FILE),
                "--env-file", str(self.env_file), *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env=self.env, check=False)
        if done.returncode != 0:
            logs = subprocess.run([*argv[:-len(args)], "logs", "--tail", "40"],
                                  capture_output=True, text=True, timeout=120, env=self.env,
                                  check=False)
            pytest.fail(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n"
                        f"{done.stderr}\n--- logs ---\n{logs.stdout[-6000:]}")
        return done

    def settings(self) -> Settings:
        """The client's settings on the host: the published Redis."""
        return Settings.from_env({"TANGRAM_REDIS_URL": f"redis://:{self.redis_password}@"
                                  f"127.0.0.1:{self.ports['STACK_REDIS_PORT']}/0"})


def project_containers(client: docker.DockerClient, project: str) -> list[object]:
    """Containers of a compose project, stopped ones included."""
    return list(client.containers.list(
        all=True, filters={"label": f"com.docker.compose.project={project}"}))


def sandbox_containers(client: docker.DockerClient, hosts: set[str]) -> list[object]:
    """Sandbox containers made by the CPU node containers ``hosts`` (their hostnames)."""
    found = client.containers.list(all=True, filters={"label": "tangram.sandbox.owner"})
    return [c for c in found if c.labels.get("tangram.sandbox.host") in hosts]


def wait_healthy_stack(project: ComposeProject, timeout: float = 240.0) -> None:
    """Block until the CPU node registered (the GPU pool starts alongside it)."""
    client = redis.Redis.from_url(project.settings().broker.redis_url)
    try:
        wait_for_nodes(Registry(client, 3.0, 600), [project.node], timeout=timeout)
    finally:
        client.close()


def wait_health(container: Any, timeout: float = 120.0) -> str:
    """The container's health once its healthcheck has decided (or ``timeout`` passed)."""
    deadline = time.monotonic() + timeout
    while True:
        container.reload()
        health: str = container.attrs["State"]["Health"]["Status"]
        if health != "starting" or time.monotonic() > deadline:
            return health
        time.sleep(1.0)


def test_compose_stack_builds_comes_up_and_serves_a_mixed_batch_from_the_host(
    engine: docker_engine.Engine, tmp_path: Path,
) -> None:
    client = docker.DockerClient(base_url=engine.url, timeout=600)
    timings: dict[str, float] = {}
    started = time.monotonic()
    ensure_stack_image(client, ROOT, announce=print)
    ensure_image(client)
    timings["images"] = time.monotonic() - started

    project = ComposeProject(engine.url, tmp_path)
    hosts: set[str] = set()
    leftover: list[object] = []
    try:
        started = time.monotonic()
        project.run("up", "-d", "--no-build")
        wait_healthy_stack(project)
        timings["up"] = time.monotonic() - started
        containers = {c.labels["com.docker.compose.service"]: c  # type: ignore[attr-defined]
                      for c in project_containers(client, project.name)}
        assert {"redis", "triton", "flower", "cpu-node", "gpu-pool"} <= set(containers)
        for name in ("redis", "triton", "gateway"):
            assert wait_health(containers[name]) == "healthy", name
        hosts = {containers["cpu-node"].attrs["Config"]["Hostname"]}  # type: ignore[attr-defined]

        started = time.monotonic()
        with TangramClient(project.settings()) as tangram:
            results = tangram.run_batch(mixed_batch(project.name), timeout=300)
        timings["batch"] = time.monotonic() - started
        check_batch_results(results)
        tasks = flower_tasks(project.ports["STACK_FLOWER_PORT"], project.flower_password)
        assert {r.action_id for r in results} <= set(tasks)

        aof = containers["redis"].exec_run(["ls", "/data/appendonlydir"])  # type: ignore[attr-defined]
        assert aof.exit_code == 0 and b".aof" in aof.output
        assert sandbox_containers(client, hosts), "the CPU node made no sandbox container"
        gateway = f"http://127.0.0.1:{project.ports['STACK_GATEWAY_PORT']}"
        request = urllib.request.Request(
            f"{gateway}/run_code", data=b'{"code": "print(6 * 7)", "language": "python"}',
            headers={"Authorization": f"Bearer {project.gateway_token}"})
        with urllib.request.urlopen(request, timeout=120) as reply:
            answer = json.loads(reply.read())
        assert answer["status"] == "Success" and answer["run_result"]["stdout"] == "42\n"
        index = f"http://127.0.0.1:{project.ports['STACK_TRITON_HTTP_PORT']}/v2/repository/index"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(index, data=b"{}"), timeout=30)
        assert refused.value.code == 403, "Triton's published port takes uploads without the key"
    finally:
        started = time.monotonic()
        project.run("down", "-v", "--remove-orphans", "-t", "30", timeout=300)
        timings["down"] = time.monotonic() - started
        with contextlib.suppress(docker.errors.DockerException):
            leftover = project_containers(client, project.name) + \
                sandbox_containers(client, hosts)
            for container in leftover:
                container.remove(force=True)  # type: ignore[attr-defined]
        client.close()
    assert not leftover, f"containers left after down: {leftover}"
    print("compose stack timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
