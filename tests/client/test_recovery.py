"""Lost-in-transit actions: the pure audit as a table, and the client's recovery on a real Redis
with a real node worker (the loss is made the way kombu makes it: a message popped off its
queue list and never recorded as unacked)."""

from __future__ import annotations

import json

import pytest
import redis
from conftest import CpuWorkers

from tangram_celery import keys
from tangram_celery.client import TangramClient, command_action
from tangram_celery.client.recovery import Stranded, audit, broker_action_ids, take_action
from tangram_celery.errors import ActionTimeout
from tangram_celery.pools.registry import Registry
from tangram_celery.settings import Settings

AUDIT_CASES = [
    # candidates, present, finished, suspects, now, lost, finished, suspects after
    (["a"], {"a"}, set(), {}, 10.0, (), (), {}),
    (["a"], set(), {"a"}, {"a": 1.0}, 10.0, (), ("a",), {}),
    (["a"], set(), set(), {}, 10.0, (), (), {"a": 10.0}),
    (["a"], set(), set(), {"a": 8.0}, 10.0, (), (), {"a": 8.0}),
    (["a"], set(), set(), {"a": 5.0}, 10.0, ("a",), (), {}),
    (["a"], {"a"}, set(), {"a": 1.0}, 10.0, (), (), {}),
    (["a", "b", "c"], {"b"}, {"c"}, {"a": 0.0, "b": 0.0}, 10.0, ("a",), ("c",), {}),
    (["a", "b"], set(), {"a", "b"}, {}, 10.0, (), ("a", "b"), {}),
]


@pytest.mark.parametrize(
    ("candidates", "present", "finished", "suspects", "now", "lost", "done", "after"),
    AUDIT_CASES,
)
def test_audit_table(
    candidates: list[str], present: set[str], finished: set[str], suspects: dict[str, float],
    now: float, lost: tuple[str, ...], done: tuple[str, ...], after: dict[str, float],
) -> None:
    outcome = audit(candidates, present, finished, suspects, now, confirm_s=5.0)
    assert outcome.lost == lost
    assert outcome.finished == done
    assert dict(outcome.suspects) == after


def _client(settings: Settings) -> TangramClient:
    return TangramClient(settings.with_(recovery_audit_s=0.4))


def test_queued_and_unacked_actions_are_not_published_again(
    settings: Settings, registry: Registry, redis_client: redis.Redis,
) -> None:
    registry.register_node("idle", 1, 4096)
    queue = keys.cpu_queue("idle")
    with _client(settings) as client:
        handles = client.submit_many(
            command_action("rq-1", f"echo {i}", id=f"rq{i}") for i in range(3)
        )
        held = redis_client.rpop(queue)
        assert held is not None
        redis_client.lpush(f"{queue}:7", redis_client.rpop(queue) or b"")
        body = json.loads(held)
        redis_client.hset("unacked", "tag-1", json.dumps([body, "", queue]))
        assert broker_action_ids(redis_client, [queue], ":", list(range(10))) == {
            h.id for h in handles}
        with pytest.raises(ActionTimeout):
            handles[0].result(timeout=2.5)
    assert redis_client.get(keys.REPUBLISHED_ACTIONS) is None
    assert sum(redis_client.llen(name) for name in redis_client.keys(f"{queue}*")) == 2


def test_an_action_lost_in_transit_is_published_again_and_runs_once(
    settings: Settings, registry: Registry, redis_client: redis.Redis, cpu_workers: CpuWorkers,
) -> None:
    registry.register_node("lossy", 1, 4096)
    queue = keys.cpu_queue("lossy")
    with _client(settings) as client:
        handles = client.submit_many(
            command_action("lt-1", f"echo lt{i}", id=f"lt{i}") for i in range(3)
        )
        popped = json.loads(redis_client.rpop(queue) or b"{}")
        assert popped["properties"]["correlation_id"] == "lt0"
        cpu_workers({"lossy": 1})
        results = [h.result(timeout=60) for h in handles]
    assert [r.output["stdout"] for r in results] == ["lt0\n", "lt1\n", "lt2\n"]
    assert all(r.attempts == 1 for r in results)
    assert int(redis_client.get(keys.REPUBLISHED_ACTIONS) or 0) == 1
    assert redis_client.get(keys.DUPLICATE_RESULTS) is None


def test_actions_stranded_on_a_dead_node_are_answered_node_lost(
    settings: Settings, registry: Registry, redis_client: redis.Redis,
) -> None:
    """A node that stops heart-beating for good: its queued action and the one its worker held
    unacked are taken out of the broker and answered ``node_lost``; the pin is dropped."""
    registry.register_node("doomed", 1, 4096)
    queue = keys.cpu_queue("doomed")
    quick = settings.with_(recovery_audit_s=0.4, stranded_after_s=3.0)
    with TangramClient(quick) as client:
        handles = client.submit_many(
            command_action("sd-1", f"echo {i}", id=f"sd{i}") for i in range(2)
        )
        held = json.loads(redis_client.rpop(queue) or b"{}")
        redis_client.hset("unacked", "tag-sd", json.dumps([held, "", queue]))
        redis_client.zadd("unacked_index", {"tag-sd": 1.0})
        registry.deregister_node("doomed")
        results = [h.result(timeout=30) for h in handles]
    assert [r.status for r in results] == ["node_lost", "node_lost"]
    assert all("doomed" in (r.error or "") for r in results)
    assert redis_client.llen(queue) == 0 and redis_client.hlen("unacked") == 0
    assert redis_client.zcard("unacked_index") == 0
    assert registry.pinned_node("sd-1") is None


def test_a_live_node_keeps_its_queued_actions(
    settings: Settings, registry: Registry, redis_client: redis.Redis,
) -> None:
    registry.register_node("slow", 1, 4096)
    quick = settings.with_(recovery_audit_s=0.4, stranded_after_s=3.0)
    with TangramClient(quick) as client:
        handle = client.submit(command_action("sl-1", "echo", id="sl0"))
        for _ in range(10):
            registry.heartbeat("slow", 1)
            with pytest.raises(ActionTimeout):
                handle.result(timeout=0.5)
    assert redis_client.llen(keys.cpu_queue("slow")) == 1


def test_a_stranded_action_is_taken_and_answered_only_while_its_node_is_silent(
        redis_client: redis.Redis, registry: Registry) -> None:
    queue = keys.cpu_queue("silent-node")
    body = json.dumps({"properties": {"correlation_id": "stranded-1"}})
    redis_client.lpush(queue, body)
    registry.register_node("silent-node", 1, 1024)
    answer = Stranded("silent-node", 5.0, json.dumps({"status": "node_lost"}), 60)
    assert take_action(redis_client, "stranded-1", queue, ":", [0], answer) is None, \
        "taken from a node that heart-beats"
    assert redis_client.llen(queue) == 1 and not redis_client.exists(
        keys.action_result("stranded-1"))
    redis_client.hset(keys.node("silent-node"), "heartbeat", 0)
    assert take_action(redis_client, "stranded-1", queue, ":", [0], answer) == body.encode()
    assert redis_client.llen(queue) == 0
    assert json.loads(redis_client.get(keys.action_result("stranded-1")) or b"{}") == {
        "status": "node_lost"}
