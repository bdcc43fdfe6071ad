"""The routing decision's Redis edge on a real Redis: pins shared by clients, chosen once,
moved off dead nodes, and every read gathered before the decision."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tangram_celery.action import Action
from tangram_celery.client import actions, router
from tangram_celery.client.router import Router
from tangram_celery.client.routing import Route, RoutingInputs
from tangram_celery.errors import NoCapacityError
from tangram_celery.pools.registry import Registry
from tangram_celery.settings import Settings


def cpu_action(trajectory: str, memory_mb: float = 400, cpu: int = 1) -> Action:
    return actions.command_action(trajectory, "true", cpu=cpu, trajectory_memory_mb=memory_mb)


@pytest.fixture()
def fresh(settings: Settings, redis_url: str) -> Iterator[Any]:
    """Routers of other clients, each with its own connection and no pin cache."""
    made: list[redis.Redis] = []

    def make(**changes: Any) -> Router:
        client = redis.Redis.from_url(redis_url)
        made.append(client)
        return Router(client, settings.with_(**changes) if changes else settings, pin_cache_s=0)

    yield make
    for client in made:
        client.close()


def test_pin_is_stable_and_shared(registry: Registry, fresh: Any) -> None:
    registry.register_node("a", cores=2, memory_mb=1000)
    registry.register_node("b", cores=2, memory_mb=1000)
    mine, other = fresh(), fresh()
    first = mine.route(cpu_action("t1")).node
    assert first is not None
    assert other.route(cpu_action("t1")).node == first
    second = mine.route(cpu_action("t2")).node
    assert second != first, "memory balancing puts the second trajectory on the other node"
    views = {v.name: v for v in registry.nodes()}
    assert views[first].reserved_mb == 400 and views[second].reserved_mb == 400
    assert registry.unpin("t1") == first
    assert {v.name: v for v in registry.nodes()}[first].reserved_mb == 0
    assert registry.unpin("t1") is None


def test_concurrent_clients_agree_on_one_node(registry: Registry, fresh: Any) -> None:
    for name in "abcd":
        registry.register_node(name, cores=4, memory_mb=10_000)
    routers = [fresh() for _ in range(16)]
    chosen: list[str | None] = []
    lock = threading.Lock()

    def pin(mine: Router) -> None:
        node = mine.route(cpu_action("shared", memory_mb=100)).node
        with lock:
            chosen.append(node)

    threads = [threading.Thread(target=pin, args=(r,)) for r in routers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(chosen)) == 1 and None not in chosen
    total = sum(v.reserved_mb for v in registry.nodes())
    assert total == 100, "the memory was reserved exactly once"


def test_a_client_that_loses_the_race_routes_to_the_winners_node(
    registry: Registry, fresh: Any,
) -> None:
    for name in ("a", "b"):
        registry.register_node(name, cores=2, memory_mb=1000)
    registry.pin("t", "b", 100)
    late = fresh()
    late.registry.pinned_node = lambda trajectory_id: None  # type: ignore[method-assign]
    decided = late.route(cpu_action("t", memory_mb=100))
    assert (decided.node, decided.queue) == ("b", "tangram.cpu.b")
    assert sum(v.reserved_mb for v in registry.nodes()) == 100


def test_dead_node_is_not_chosen_and_pins_move(registry: Registry, fresh: Any) -> None:
    registry.register_node("a", cores=2, memory_mb=1000)
    mine = fresh()
    assert mine.route(cpu_action("t", memory_mb=100)).node == "a"
    registry.deregister_node("a")
    with pytest.raises(NoCapacityError):
        mine.route(cpu_action("t", memory_mb=100))
    registry.register_node("b", cores=2, memory_mb=1000)
    assert mine.route(cpu_action("t", memory_mb=100)).node == "b"
    views = {v.name: v for v in registry.nodes()}
    assert views["a"].reserved_mb == 0 and views["b"].reserved_mb == 100


def test_announced_node_takes_new_trajectories_until_its_worker_registers(
    redis_client: redis.Redis, fresh: Any,
) -> None:
    registry = Registry(redis_client, node_ttl_s=1.0, trajectory_ttl_s=3600)
    mine = fresh(node_ttl_s=1.0, trajectory_ttl_s=3600)
    registry.register_node("busy", 2, 8192)
    for i in range(4):
        assert mine.route(cpu_action(f"old-{i}", 100)).node == "busy"
    registry.announce_node("new", 2, 8192, alive_for_s=2.5)
    (view,) = [v for v in registry.nodes() if v.name == "new"]
    assert view.alive and view.starting and view.trajectories == 0
    assert [mine.route(cpu_action(f"fresh-{i}", 100)).node for i in range(4)] == ["new"] * 4
    registry.heartbeat("busy", 2)  # still alive (1 s ttl) however slow the routes above were
    assert mine.route(cpu_action("fresh-4", 100)).node == "busy"  # 5/2 vs 5/2: the name wins
    registry.register_node("new", 2, 8192)
    (view,) = [v for v in registry.nodes() if v.name == "new"]
    assert not view.starting and view.reserved_mb == 400 and view.trajectories == 4


def test_reads_are_gathered_before_the_one_decision(
    registry: Registry, redis_url: str, settings: Settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry.register_node("a", cores=2, memory_mb=1000)
    client = redis.Redis.from_url(redis_url)
    mine = Router(client, settings)
    log: list[str] = []
    execute = client.execute_command

    def logged(*args: Any, **options: Any) -> Any:
        log.append(str(args[0]))
        return execute(*args, **options)

    def decide(action: Action, inputs: RoutingInputs) -> Route:
        log.append("route")
        return real_route(action, inputs)

    real_route = router.route
    monkeypatch.setattr(client, "execute_command", logged)
    monkeypatch.setattr(router, "route", decide)
    mine.route(cpu_action("t"))
    assert log.count("route") == 1
    before, after = log[:log.index("route")], log[log.index("route") + 1:]
    assert before and {"GET", "SMEMBERS"} <= set(before)
    assert set(after) <= {"EVALSHA", "EVAL", "SCRIPT LOAD", "DEL", "EXPIRE"}, after
    log.clear()
    for _ in range(3):
        mine.route(cpu_action("t"))
    assert log == ["route"] * 3, "a trajectory's next actions within the cache read nothing"
    client.close()
