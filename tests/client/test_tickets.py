"""The shared line of trajectories waiting for memory, on a real Redis: strict FCFS across
clients, memory never reserved twice, and a dead client's ticket dropped and answered."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from rich.console import Console

from tangram_celery import keys
from tangram_celery.action import Action
from tangram_celery.autoscale.controller import RecentAct, cpu_load
from tangram_celery.autoscale.work import Work
from tangram_celery.client import TangramClient, actions, command_action
from tangram_celery.client.router import Router
from tangram_celery.client.waitlist import Waitlist
from tangram_celery.observe.status import StatusData, render_status
from tangram_celery.pools.inventory import read_inventory
from tangram_celery.pools.registry import Registry
from tangram_celery.settings import Settings
from tangram_celery.tasks.ledger import Ledger


def cpu_action(trajectory: str, memory_mb: float) -> Action:
    return actions.command_action(trajectory, "true", trajectory_memory_mb=memory_mb)


@pytest.fixture()
def fresh(settings: Settings, redis_url: str) -> Iterator[Any]:
    """Routers of separate clients, each with its own connection and no pin cache."""
    made: list[redis.Redis] = []

    def make() -> Router:
        client = redis.Redis.from_url(redis_url)
        made.append(client)
        return Router(client, settings, pin_cache_s=0)

    yield make
    for client in made:
        client.close()


def test_the_line_is_fcfs_across_clients(registry: Registry, fresh: Any) -> None:
    registry.register_node("a", cores=2, memory_mb=1000)
    one, two = fresh(), fresh()
    assert one.route(cpu_action("t1", 400)).node == "a"
    assert two.route(cpu_action("t2", 400)).node == "a"
    big = one.route(cpu_action("t3", 400))
    assert big.wait is not None and big.wait.ahead == 0 and big.queue == ""
    small = two.route(cpu_action("t4", 100))
    assert small.wait is not None and small.wait.ahead == 1, "it fits, but t3 came first"
    assert one.route(cpu_action("t5", 50)).wait is not None
    registry.unpin("t1")
    assert two.route(cpu_action("t4", 100)).wait is not None, "t4 may not pass t3"
    assert one.route(cpu_action("t3", 400)).node == "a"
    assert two.route(cpu_action("t4", 100)).node == "a"
    assert one.route(cpu_action("t5", 50)).node == "a"
    assert [a["trajectory"] for a in one.tickets.admissions()] == ["t3", "t4", "t5"]
    assert {v.name: v for v in registry.nodes()}["a"].reserved_mb == 950


def test_memory_is_never_reserved_past_a_node(registry: Registry, fresh: Any) -> None:
    registry.register_node("a", cores=4, memory_mb=1000)
    routers = [fresh() for _ in range(16)]
    routes: list[Any] = []
    lock = threading.Lock()

    def place(index: int) -> None:
        decided = routers[index].route(cpu_action(f"c{index}", 100))
        with lock:
            routes.append(decided)

    threads = [threading.Thread(target=place, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.node == "a" for r in routes) == 10
    assert sum(r.wait is not None for r in routes) == 6
    assert {v.name: v for v in registry.nodes()}["a"].reserved_mb == 1000


def test_a_dead_clients_ticket_is_dropped_and_answered(
    registry: Registry, fresh: Any, redis_client: redis.Redis, settings: Settings,
) -> None:
    registry.register_node("a", cores=2, memory_mb=1000)
    dead, alive = fresh(), fresh()
    dead.tickets.lease_s = 0.3
    assert alive.route(cpu_action("held", 900)).node == "a"
    lost = cpu_action("lost", 500)
    assert dead.route(lost).wait is not None
    assert alive.route(cpu_action("next", 50)).wait is not None, "behind the live ticket"
    time.sleep(0.5)
    assert alive.route(cpu_action("next", 50)).node == "a", "the dead ticket no longer blocks"
    assert [d["trajectory"] for d in alive.dropped] == ["lost"]
    assert redis_client.zcard(keys.MEMORY_TICKETS) == 0
    assert redis_client.llen(keys.MEMORY_ABANDONED) == 1
    ledger = Ledger(redis_client, settings.broker.result_ttl_s)
    waitlist = Waitlist(alive, ledger, lambda action, queue: None, 60.0)
    waitlist.answer_dropped()
    stored = ledger.stored(lost.id)
    assert stored is not None and stored["status"] == "client_lost"
    assert "never run" in stored["error"]


def test_a_live_client_keeps_its_place_by_renewing(registry: Registry, fresh: Any) -> None:
    registry.register_node("a", cores=2, memory_mb=1000)
    waiting, other = fresh(), fresh()
    waiting.tickets.lease_s = 0.3
    assert other.route(cpu_action("held", 900)).node == "a"
    assert waiting.route(cpu_action("first", 500)).wait is not None
    for _ in range(5):
        time.sleep(0.1)
        waiting.tickets.renew(["first"])
    assert other.route(cpu_action("second", 50)).wait is not None
    assert other.dropped == []


def test_parked_trajectories_are_placed_in_the_lines_order_not_their_stamps(
    registry: Registry, fresh: Any, redis_client: redis.Redis, settings: Settings,
) -> None:
    registry.register_node("a", cores=2, memory_mb=1000)
    router = fresh()
    assert router.route(cpu_action("hog", 900)).node == "a"
    first, second = cpu_action("first", 400), cpu_action("second", 400)
    waits = [router.route(first).wait, router.route(second).wait]
    assert [w.ahead if w else None for w in waits] == [0, 1]
    assert router.tickets.in_line_order(["second", "gone", "first"]) == [
        "first", "second", "gone"]
    published: list[str] = []
    waitlist = Waitlist(router, Ledger(redis_client, settings.broker.result_ttl_s),
                        lambda action, queue: published.append(action.trajectory_id), 60.0)
    now = time.time()
    waitlist.park(first, waits[0], now)
    waitlist.park(second, waits[1], now - 5.0)
    registry.unpin("hog")
    registry.heartbeat("a", 2)
    deadline = time.monotonic() + 10
    while len(published) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    waitlist.close()
    assert published == ["first", "second"], "the second in line stamped earlier blocked both"
    assert redis_client.zcard(keys.MEMORY_TICKETS) == 0


def test_a_parked_action_times_out_or_is_cancelled_with_an_answer(
    settings: Settings, registry: Registry,
) -> None:
    registry.register_node("a", cores=2, memory_mb=1000)
    with TangramClient(settings) as client:
        client.submit(command_action("hog", "true", trajectory_memory_mb=900))
        started = time.monotonic()
        late = client.submit(command_action("late", "true", trajectory_memory_mb=200,
                                            timeout_s=0.5))
        second = client.submit(command_action("late", "echo 2", timeout_s=30))
        assert time.monotonic() - started < 2 and late.queue == second.queue == ""
        timed_out = late.result(timeout=10)
        assert timed_out.status == "no_capacity"
        assert "for 200 MB of memory" in timed_out.error
        assert "1000 MB in all, 100 MB unreserved" in timed_out.error
        registry.heartbeat("a", 2)
        ended = client.submit(command_action("ended", "true", trajectory_memory_mb=200))
        client.end_trajectory("ended")
        assert ended.result(timeout=10).status == "cancelled"
        registry.heartbeat("a", 2)
        closing = client.submit(command_action("closing", "true", trajectory_memory_mb=200))
    with TangramClient(settings) as other:
        assert other._ledger.stored(closing.id)["status"] == "cancelled"  # type: ignore[index]
        assert other._ledger.stored(second.id)["status"] == "cancelled"  # type: ignore[index]


@contextlib.contextmanager
def beating(registry: Registry, node: str) -> Iterator[None]:
    """Keep a registered node alive (heart-beating) while the block runs."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(0.3):
            registry.heartbeat(node, 2)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


CHILD = """
import sys, time
from tangram_celery.client import TangramClient, command_action
from tangram_celery.settings import Settings
client = TangramClient(Settings.from_env({}, redis_url=sys.argv[1]))
client._router.tickets.lease_s = 2.0
handle = client.submit(command_action("victim", "true", trajectory_memory_mb=500))
print(handle.id, handle.queue or "parked", flush=True)
time.sleep(120)
"""


def test_a_killed_client_leaves_the_line_and_its_action_is_answered(
    settings: Settings, registry: Registry,
) -> None:
    registry.register_node("a", cores=2, memory_mb=1000)
    root = Path(__file__).resolve().parents[2]
    with beating(registry, "a"), TangramClient(settings) as client:
        client.submit(command_action("hog", "true", trajectory_memory_mb=900))
        child = subprocess.Popen([sys.executable, "-c", CHILD, settings.broker.redis_url],
                                 stdout=subprocess.PIPE, text=True,
                                 env={**os.environ, "PYTHONPATH": str(root)})
        try:
            assert child.stdout is not None
            victim, where = child.stdout.readline().split()
            assert where == "parked"
            after = client.submit(command_action("after", "true", trajectory_memory_mb=50))
            assert after.queue == "", "it fits, but waits behind the victim (FCFS)"
        finally:
            child.kill()
            child.wait(10)
        deadline = time.monotonic() + 10
        while client._ledger.stored(victim) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert registry.pinned_node("after") == "a"
        answered = client._ledger.stored(victim)
        assert answered is not None and answered["status"] == "client_lost"
        assert answered["trajectory_id"] == "victim"


def test_status_and_the_autoscaler_see_the_memory_line(
    registry: Registry, fresh: Any, redis_client: redis.Redis, settings: Settings,
) -> None:
    registry.register_node("a", cores=2, memory_mb=1000)
    router = fresh()
    assert router.route(cpu_action("held", 900)).node == "a"
    assert router.route(cpu_action("w1", 400)).wait is not None
    assert router.route(cpu_action("w2", 300)).wait is not None
    inventory = read_inventory(redis_client, settings)
    assert (inventory.memory_line.waiting, inventory.memory_line.memory_mb) == (2, 700.0)
    console = Console(record=True, width=200)
    console.print(render_status(StatusData(inventory, {}, inspected=True)))
    text = " ".join(console.export_text().split())
    assert "2 trajectories wait for memory on the CPU pool (700 MB asked" in text
    load = cpu_load(inventory, Work(), Work(), RecentAct(), size=1, member_units=2,
                    since_scale_s=0.0, member_memory_mb=1000)
    assert load.memory_mb == 900 + 700
    router.tickets.withdraw("w1")
    router.tickets.withdraw("w2")
    assert read_inventory(redis_client, settings).memory_line.waiting == 0
