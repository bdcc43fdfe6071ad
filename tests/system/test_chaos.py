"""Faults on real parts: workers SIGKILLed mid-run and a Redis restart lose no action and
complete none twice."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import docker_engine
import pytest
import redis

from tangram_celery import keys
from tangram_celery.client import ActionHandle, TangramClient, command_action
from tangram_celery.client.recovery import broker_action_ids
from tangram_celery.errors import ActionTimeout
from tangram_celery.pools.launch import spawn_cpu_worker, wait_for_nodes
from tangram_celery.pools.registry import Registry
from tangram_celery.processes import stop_process
from tangram_celery.sandbox.docker.image import DEFAULT_TAG, ensure_image
from tangram_celery.settings import Settings
from tangram_celery.stack.broker import RedisServer, embedded_redis

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def cluster(server: RedisServer, nodes: dict[str, int], logs: Path,
            extra_env: dict[str, str] | None = None,
            ) -> Iterator[tuple[Settings, dict[str, subprocess.Popen[bytes]], dict[str, str]]]:
    root = Path("/var/tmp") / f"tangram-chaos-{uuid.uuid4().hex[:8]}"
    settings = Settings.from_env({}, redis_url=server.url, sandbox_root=root, max_timeout_s=5,
                                 default_timeout_s=5, visibility_margin_s=6,
                                 node_heartbeat_s=0.5, node_ttl_s=3.0, trajectory_memory_mb=64)
    env = {"TANGRAM_REDIS_URL": server.url, "TANGRAM_SANDBOX_ROOT": str(root),
           "TANGRAM_MAX_TIMEOUT_S": "5", "TANGRAM_DEFAULT_TIMEOUT_S": "5",
           "TANGRAM_VISIBILITY_MARGIN_S": "6", "TANGRAM_NODE_HEARTBEAT_S": "0.5",
           "TANGRAM_NODE_TTL_S": "3.0", **(extra_env or {})}
    procs = {n: spawn_cpu_worker(env, n, c, logs / f"{n}.log") for n, c in nodes.items()}
    try:
        registry = Registry(redis.Redis.from_url(server.url), 3.0, 3600)
        wait_for_nodes(registry, list(nodes))
        yield settings, procs, env
    finally:
        for proc in procs.values():
            stop_process(proc)


def results_done(client: redis.Redis, handles: list[ActionHandle]) -> int:
    stored = client.mget([keys.action_result(h.id) for h in handles])
    return sum(raw is not None for raw in stored)


def wait_until(condition: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"condition not met in {timeout} s")


def whereabouts(client: redis.Redis, handle: ActionHandle) -> dict[str, object]:
    """Where the broker and the ledger hold an action, to explain a missing result."""
    in_broker = broker_action_ids(client, [handle.queue], ":", list(range(10)))
    tags = [json.loads(v)[0]["properties"]["delivery_tag"] for v in client.hvals("unacked")
            if json.loads(v)[0]["properties"].get("correlation_id") == handle.id]
    return {
        "queued_or_unacked": handle.id in in_broker,
        "unacked_index": {t: client.zscore("unacked_index", t) for t in tags},
        "attempts": client.get(keys.action_attempts(handle.id)),
        "ledger_result": client.get(keys.action_result(handle.id)) is not None,
        "republished": client.get(keys.REPUBLISHED_ACTIONS),
        "now": time.time(),
    }


def check_exactly_once(client: redis.Redis, handles: list[ActionHandle]) -> dict[str, int]:
    results = []
    for handle in handles:
        try:
            results.append(handle.result(timeout=240))
        except ActionTimeout as exc:
            raise AssertionError(f"{exc}; {whereabouts(client, handle)}; "
                                 f"{results_done(client, handles)} of {len(handles)} results "
                                 "stored") from None
    for handle, result in zip(handles, results, strict=True):
        assert result.action_id == handle.id and result.ok, \
            (result.status, result.error, result.output)
        assert result.output["stdout"] == f"{handle.id}\n"
        stored = json.loads(client.get(keys.action_result(handle.id)) or b"{}")
        assert stored["action_id"] == handle.id
    reruns = sum(r.attempts > 1 for r in results)
    duplicates = int(client.get(keys.DUPLICATE_RESULTS) or 0)
    republished = int(client.get(keys.REPUBLISHED_ACTIONS) or 0)
    return {"actions": len(results), "reruns": reruns, "duplicate_stores": duplicates,
            "republished": republished}


@pytest.fixture()
def docker_env() -> Iterator[dict[str, str]]:
    """Node settings for the docker sandbox backend on a real engine holding the image."""
    engine = docker_engine.acquire_for_tests("docker chaos")
    try:
        client = docker.DockerClient(base_url=engine.url, timeout=300)
        try:
            ensure_image(client, DEFAULT_TAG)
        finally:
            client.close()
        yield {"TANGRAM_SANDBOX_BACKEND": "docker", "TANGRAM_SANDBOX_DOCKER_URL": engine.url}
    finally:
        docker_engine.release(engine)


def kill_twice_and_check(server: RedisServer, tmp_path: Path, nodes: dict[str, int],
                         count: int, trajectories: int, extra_env: dict[str, str]) -> None:
    """Submit ``count`` actions; SIGKILL node ``chaos-b`` twice mid-run; every action is
    answered exactly once."""
    with cluster(server, nodes, tmp_path, extra_env) as (settings, procs, env), \
            TangramClient(settings) as client:
        raw = redis.Redis.from_url(server.url)
        actions = [command_action(f"ck-{i % trajectories}", f"echo ck{i:04d}", id=f"ck{i:04d}")
                   for i in range(count)]
        handles = client.submit_many(actions)
        for threshold in (count // 5, count * 11 // 20):
            wait_until(lambda t=threshold: results_done(raw, handles) >= t, 180)
            procs["chaos-b"].kill()
            procs["chaos-b"].wait(10)
            time.sleep(0.5)
            procs["chaos-b"] = spawn_cpu_worker(env, "chaos-b", 1, tmp_path / "chaos-b.log")
        report = check_exactly_once(raw, handles)
    print(f"worker-kill chaos ({extra_env or 'bwrap'}): {report}, faults injected: 2 SIGKILLs")
    assert report["actions"] == count


def test_worker_kill_loses_nothing(tmp_path: Path) -> None:
    with embedded_redis(data_dir=tmp_path) as server:
        kill_twice_and_check(server, tmp_path, {"chaos-a": 1, "chaos-b": 1, "chaos-c": 1},
                             1000, 50, {})


def test_worker_kill_loses_nothing_on_the_docker_backend(
    tmp_path: Path, docker_env: dict[str, str]
) -> None:
    with embedded_redis(data_dir=tmp_path) as server:
        kill_twice_and_check(server, tmp_path, {"chaos-b": 1, "chaos-c": 1}, 300, 12,
                             docker_env)


def test_broker_restart_loses_nothing(tmp_path: Path) -> None:
    with embedded_redis(appendonly=True, data_dir=tmp_path) as server, \
            cluster(server, {"br-a": 2}, tmp_path) as (settings, _, __), \
            TangramClient(settings) as client:
        raw = redis.Redis.from_url(server.url)
        first = client.submit_many(
            command_action(f"br-{i % 10}", f"echo br{i:03d}", id=f"br{i:03d}") for i in range(150)
        )
        wait_until(lambda: results_done(raw, first) >= 40, 120)
        server.restart(down_s=1.0)
        raw = redis.Redis.from_url(server.url)
        second = client.submit_many(
            command_action(f"br-{i % 10}", f"echo br{i:03d}", id=f"br{i:03d}")
            for i in range(150, 200)
        )
        report = check_exactly_once(raw, first + second)
    print(f"broker-restart chaos: {report}")
    assert report["actions"] == 200
