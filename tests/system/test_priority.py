"""The router across resource types, FCFS inside a queue, and prefetch that strands nobody.

Tangram uses no message priorities: every message lands in the queue's one priority-0 list and
is consumed in publish order. Workers hold no more messages than they run or deliberately queue in
their admission gate (``worker_prefetch_multiplier=1`` with ``task_acks_late``), so an idle worker
always gets the next message while a busy one holds nothing extra.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tangram_bench.ratelimited import RateLimitedService, ServiceLimits
from tangram_celery import keys
from tangram_celery.action import ActionLimits, parse_action
from tangram_celery.client import TangramClient
from tangram_celery.client.routing import queue_for
from tangram_celery.pools.api_pool import api_action, spawn_api_worker, wait_for_worker, worker_name
from tangram_celery.processes import stop_process
from tangram_celery.settings import Settings
from tangram_celery.tasks.app import celery_config, make_app

LIMITS = ActionLimits(apis=frozenset({"search", "judge"}))

ROUTES = [
    ("code on its trajectory's node", {"kind": "exec", "payload": {"code": "1"}}, "n1",
     "tangram.cpu.n1"),
    ("test run on its node", {"kind": "test_run", "payload": {"cmd": "pytest"},
                              "cost": {"cpu": [1, 4]}}, "n2", "tangram.cpu.n2"),
    ("reward model, default pool", {"kind": "reward", "payload": {"model": "rm"},
                                    "cost": {"gpu": 1}}, None, "tangram.gpu.default"),
    ("reward model, named pool", {"kind": "reward", "payload": {"model": "rm", "pool": "big"},
                                  "cost": {"gpu": {"set": [1, 2, 4]}}}, None, "tangram.gpu.big"),
    ("one API", {"kind": "api", "payload": {"path": "/"}, "cost": {"api:search": 1}}, None,
     "tangram.api.search"),
    ("several APIs: the first by name", {"kind": "api", "payload": {"path": "/"},
                                         "cost": {"api:search": 1, "api:judge": 1}}, None,
     "tangram.api.judge"),
]


@pytest.mark.parametrize(("name", "body", "node", "queue"), ROUTES, ids=[r[0] for r in ROUTES])
def test_one_router_for_every_kind(name: str, body: dict[str, object], node: str | None,
                                   queue: str) -> None:
    action = parse_action({"trajectory_id": "t", **body}, LIMITS)
    assert queue_for(action, node) == queue


def test_priority_and_prefetch_are_configured_in_one_place(settings: Settings) -> None:
    config = celery_config(settings)
    transport = config["broker_transport_options"]
    assert transport["priority_steps"] == list(range(10)) and transport["sep"] == ":"
    assert config["worker_prefetch_multiplier"] == 1 and config["task_acks_late"] is True


def test_messages_wait_in_one_list_in_publish_order(redis_client: redis.Redis,
                                                    settings: Settings) -> None:
    live = settings.with_(api_limits="idle=url:http://idle.test,concurrency:1")
    with TangramClient(live) as client:
        ids = [client.submit(api_action(f"t{k}", "idle", "/")).id for k in range(6)]
    queue = keys.api_queue("idle")
    raw = redis_client.lrange(queue, 0, -1)
    messages = [json.loads(m) for m in reversed(raw)]  # LPUSH in, BRPOP out: oldest last
    assert [m["headers"]["id"] for m in messages] == ids
    assert {m["properties"].get("priority") or 0 for m in messages} == {0}
    assert not [k for k in redis_client.keys(f"{queue}:*")], "no other priority list is used"


# ----------------------------------------------------------------------------- real workers


@dataclass
class Lane:
    settings: Settings
    service: RateLimitedService


@pytest.fixture(scope="module")
def lane(redis_url: str) -> Iterator[Lane]:
    """An API with room for 4 calls and two real workers that each hold one message."""
    limits = ServiceLimits(rate_per_s=1000, burst=1000, concurrency=16, base_s=0.005,
                           work_s=0.005, lifetime_s=120)
    with RateLimitedService(limits) as service, \
            tempfile.TemporaryDirectory(prefix="tangram-lane-") as logs:
        declared = f"lane=url:{service.url},concurrency:4"
        live = Settings.from_env({}, redis_url=redis_url, api_limits=declared)
        env = {"TANGRAM_REDIS_URL": live.broker.redis_url, "TANGRAM_API_LIMITS": declared}
        processes = [spawn_api_worker(env, "lane", concurrency=1,
                                      log_path=Path(logs) / f"lane-{k}.log") for k in range(2)]
        app = make_app(live)
        try:
            for process in processes:
                wait_for_worker(app, worker_name("lane", process.pid), process)
            yield Lane(live, service)
        finally:
            for process in processes:
                stop_process(process)


@pytest.mark.slow
def test_a_busy_worker_strands_no_new_action(lane: Lane) -> None:
    with TangramClient(lane.settings) as client:
        long = client.submit(api_action("busy", "lane", "/slow", params={"delay": 3},
                                        timeout_s=10))
        deadline = time.monotonic() + 10
        while lane.service.stats().in_flight == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        start = time.monotonic()
        shorts = [client.submit(api_action(f"s{k}", "lane", "/fast")) for k in range(6)]
        results = [h.result(10) for h in shorts]
        waited = time.monotonic() - start
        slow = long.result(10)
    assert all(r.ok for r in results) and slow.ok
    assert waited < 2.0, "a short action sat behind the 3 s one in the busy worker's prefetch"
    assert slow.act["exec"] >= 2.9
    assert {r.node for r in results} != {slow.node} and slow.node not in {r.node for r in results}


@pytest.mark.slow
def test_actions_start_in_submission_order(lane: Lane) -> None:
    """Each action takes the whole API (amount 4), so they run one at a time: the order they
    start in is the order the queue handed them out, across both workers. (The first is let in
    alone: two idle workers handed two messages in the same millisecond may race.)"""
    with TangramClient(lane.settings) as client:
        first = client.submit(api_action("f0", "lane", "/x", params={"delay": 0.3}, amount=4))
        deadline = time.monotonic() + 10
        while lane.service.stats().in_flight == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        handles = [first, *(client.submit(api_action(f"f{k}", "lane", "/x", amount=4))
                            for k in range(1, 8))]
        results = [h.result(30) for h in handles]
    assert all(r.ok for r in results)
    assert len({r.node for r in results}) == 2, "both workers took part"
    started = sorted(results, key=lambda r: r.timings.admitted)
    assert [r.action_id for r in started] == [h.id for h in handles]
