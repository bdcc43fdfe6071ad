"""Node registration and trajectory pinning on a real Redis."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from tangram_celery.errors import NoCapacityError
from tangram_celery.pools.registry import Registry


def test_pin_is_stable_and_shared(registry: Registry, redis_client: redis.Redis) -> None:
    registry.register_node("a", cores=2, memory_mb=1000)
    registry.register_node("b", cores=2, memory_mb=1000)
    first = registry.pin("t1", cores=1, memory_mb=400)
    other = Registry(redis.Redis.from_url(_url(redis_client)), 10, 60)
    assert other.pin("t1", cores=1, memory_mb=400) == first
    second = registry.pin("t2", cores=1, memory_mb=400)
    assert second != first, "memory balancing puts the second trajectory on the other node"
    views = {v.name: v for v in registry.nodes()}
    assert views[first].reserved_mb == 400 and views[second].reserved_mb == 400
    assert registry.unpin("t1") == first
    assert {v.name: v for v in registry.nodes()}[first].reserved_mb == 0
    assert registry.unpin("t1") is None


def test_concurrent_clients_agree_on_one_node(registry: Registry,
                                              redis_client: redis.Redis) -> None:
    for name in "abcd":
        registry.register_node(name, cores=4, memory_mb=10_000)
    chosen: list[str] = []
    lock = threading.Lock()

    def pin() -> None:
        mine = Registry(redis.Redis.from_url(_url(redis_client)), 10, 60)
        node = mine.pin("shared", cores=1, memory_mb=100)
        with lock:
            chosen.append(node)

    threads = [threading.Thread(target=pin) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(chosen)) == 1
    total = sum(v.reserved_mb for v in registry.nodes())
    assert total == 100, "the memory was reserved exactly once"


def test_dead_node_is_not_chosen_and_pins_move(registry: Registry) -> None:
    registry.register_node("a", cores=2, memory_mb=1000)
    assert registry.pin("t", cores=1, memory_mb=100) == "a"
    registry.deregister_node("a")
    with pytest.raises(NoCapacityError):
        registry.pin("t", cores=1, memory_mb=100)
    registry.register_node("b", cores=2, memory_mb=1000)
    assert registry.pin("t", cores=1, memory_mb=100) == "b"


def test_heartbeat_keeps_node_alive(redis_client: redis.Redis) -> None:
    registry = Registry(redis_client, node_ttl_s=0.3, trajectory_ttl_s=60)
    registry.register_node("a", cores=1, memory_mb=100)
    time.sleep(0.4)
    assert not registry.nodes()[0].alive
    registry.heartbeat("a", free_cores=1)
    assert registry.nodes()[0].alive


def _url(client: redis.Redis) -> str:
    kwargs = client.connection_pool.connection_kwargs
    return f"redis://{kwargs['host']}:{kwargs['port']}/{kwargs.get('db', 0)}"


def test_announced_node_takes_new_trajectories_until_its_worker_registers(
    redis_client: redis.Redis,
) -> None:
    registry = Registry(redis_client, node_ttl_s=1.0, trajectory_ttl_s=3600)
    registry.register_node("busy", 2, 8192)
    for i in range(4):
        assert registry.pin(f"old-{i}", 1, 100) == "busy"
    registry.announce_node("new", 2, 8192, alive_for_s=2.5)
    (view,) = [v for v in registry.nodes() if v.name == "new"]
    assert view.alive and view.starting and view.trajectories == 0
    assert [registry.pin(f"fresh-{i}", 1, 100) for i in range(4)] == ["new"] * 4
    assert registry.pin("fresh-4", 1, 100) == "busy"  # 5/2 vs 5/2: the tie falls to the name
    registry.register_node("new", 2, 8192)
    (view,) = [v for v in registry.nodes() if v.name == "new"]
    assert not view.starting and view.reserved_mb == 400 and view.trajectories == 4


def test_announced_node_that_never_starts_dies_after_its_grace(redis_client: redis.Redis) -> None:
    registry = Registry(redis_client, node_ttl_s=0.5, trajectory_ttl_s=3600)
    registry.announce_node("ghost", 2, 8192, alive_for_s=1.0)
    assert [v.alive for v in registry.nodes()] == [True]
    time.sleep(1.2)
    assert [v.alive for v in registry.nodes()] == [False]


def test_heartbeats_carry_the_schedulers_calls_and_time(redis_client: redis.Redis) -> None:
    registry = Registry(redis_client, node_ttl_s=10, trajectory_ttl_s=60)
    for name in ("a", "b"):
        registry.register_node(name, cores=1, memory_mb=100)
    registry.heartbeat("a", free_cores=1, decisions=(3, 0.25))
    registry.heartbeat("b", free_cores=1, decisions=(2, 0.5))
    registry.heartbeat("b", free_cores=1)
    assert registry.decisions(["a", "b"]) == (5, 0.75)
    assert registry.decisions(["gone"]) == (0, 0.0)
