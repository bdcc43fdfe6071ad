"""Node registration, heartbeats and the atomic pin on a real Redis."""

from __future__ import annotations

import time

import redis

from tangram_celery.pools.registry import Registry


def test_pin_is_atomic_and_the_first_pin_wins(registry: Registry) -> None:
    for name in ("a", "b"):
        registry.register_node(name, cores=2, memory_mb=1000)
    assert registry.pin("t", "a", 400) == "a"
    assert registry.pin("t", "b", 400) == "a", "a pinned trajectory keeps its node"
    assert registry.pinned_node("t") == "a"
    views = {v.name: v for v in registry.nodes()}
    assert (views["a"].reserved_mb, views["a"].trajectories) == (400, 1)
    assert (views["b"].reserved_mb, views["b"].trajectories) == (0, 0)
    assert registry.unpin("t") == "a" and registry.pinned_node("t") is None
    assert {v.name: v for v in registry.nodes()}["a"].reserved_mb == 0


def test_heartbeat_keeps_node_alive(redis_client: redis.Redis) -> None:
    registry = Registry(redis_client, node_ttl_s=0.3, trajectory_ttl_s=60)
    registry.register_node("a", cores=1, memory_mb=100)
    time.sleep(0.4)
    assert not registry.nodes()[0].alive
    registry.heartbeat("a", free_cores=1)
    assert registry.nodes()[0].alive


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
