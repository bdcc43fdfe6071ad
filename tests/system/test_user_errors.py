"""Errors a training script can cause are refused at submit with one clear line: no broker, an
action no pool can ever run, an unknown reward model. And ``run_batch`` can show progress."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
import redis

from tangram_celery import keys
from tangram_celery.action import parse_action
from tangram_celery.client import TangramClient, code_action, command_action
from tangram_celery.errors import BrokerUnreachable, NoCapacityError, ValidationError
from tangram_celery.pools.registry import Registry
from tangram_celery.settings import Settings

CpuWorkers = Callable[..., list[str]]


def reward(model: str, gpus: int = 1, pool: str = "default") -> dict[str, object]:
    return {"kind": "reward", "trajectory_id": "r", "cost": {"gpu": gpus},
            "payload": {"model": model, "pool": pool, "inputs": {}}}


def one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(exc.value)
    assert "\n" not in message and len(message) < 400, message
    return message


@pytest.mark.parametrize("kind", ["exec", "reward"])
def test_no_broker_is_one_line_and_fast(settings: Settings, kind: str) -> None:
    dead = settings.with_(redis_url="redis://:hunter2@127.0.0.1:1/0")
    action = code_action("t", "print(1)") if kind == "exec" else reward("rm")
    with TangramClient(dead) as client:
        started = time.monotonic()
        with pytest.raises(BrokerUnreachable) as raised:
            client.submit(action)
    assert time.monotonic() - started < 5
    message = one_line(raised)
    assert "127.0.0.1:1/0" in message and "hunter2" not in message


def test_cpu_minimum_beyond_the_trajectory_node_is_refused(
    settings: Settings, registry: Registry
) -> None:
    registry.register_node("small", 2, 4096)
    with TangramClient(settings) as client:
        client.submit(command_action("big-traj", "true"))
        with pytest.raises(NoCapacityError) as raised:
            client.submit(command_action("big-traj", "true", cpu=(4, 8)))
        assert "node small, which has 2" in one_line(raised)
        with pytest.raises(NoCapacityError, match="no live CPU node"):
            client.submit(command_action("new-traj", "true", cpu=16))
        client.submit(command_action("big-traj", "true", cpu=(2, 8)))


def test_api_amount_beyond_its_limits_is_refused(settings: Settings) -> None:
    limited = settings.with_(api_limits="search=url:http://127.0.0.1:9,concurrency:2")
    action = {"kind": "api", "trajectory_id": "a", "cost": {"api:search": 3},
              "payload": {"path": "/q"}}
    with TangramClient(limited) as client, pytest.raises(ValidationError) as raised:
        client.submit(action)
    assert "can ever grant at once (2)" in one_line(raised)


def test_reward_checked_against_what_the_gpu_pool_publishes(
    settings: Settings, redis_client: redis.Redis
) -> None:
    with TangramClient(settings) as client:
        client.submit(reward("anything")).id  # noqa: B018 - no pool published: not checked
        redis_client.hset(keys.gpu_pool("gp"), mapping={
            "gpus": 2, "free_gpus": 2, "heartbeat": time.time(), "worker": "w",
            "models": json.dumps(["rm", "judge"]), "residents": "[]"})
        with pytest.raises(ValidationError) as raised:
            client.submit(reward("nope", pool="gp"))
        assert "unknown reward model 'nope' in GPU pool 'gp'" in one_line(raised)
        with pytest.raises(NoCapacityError, match="has 2"):
            client.submit(reward("rm", gpus=4, pool="gp"))
        client.submit(reward("rm", gpus=2, pool="gp"))


def test_invalid_actions_read_as_one_line() -> None:
    with pytest.raises(ValidationError) as raised:
        parse_action({"kind": "exec", "trajectory_id": "t", "cost": {"cpu": [4, 2]},
                      "payload": {"cmd": "true"}})
    assert one_line(raised) == "invalid action: cost.cpu: min 4 > max 2"


@pytest.mark.slow
def test_run_batch_progress_bar(settings: Settings, cpu_workers: CpuWorkers,
                                capsys: pytest.CaptureFixture[str]) -> None:
    cpu_workers({"pg-a": 2})
    with TangramClient(settings) as client:
        results = client.run_batch([code_action(f"pg-{k}", "print(1)") for k in range(4)],
                                   timeout=60, progress=True)
        for k in range(4):
            client.end_trajectory(f"pg-{k}")
    assert all(r.ok for r in results)
    captured = capsys.readouterr()
    assert "actions" in captured.err and "4/4" in captured.err
    assert captured.out == ""
