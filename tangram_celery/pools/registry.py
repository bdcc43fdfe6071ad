"""Redis-side state shared by clients and workers: live CPU nodes and trajectory pins.

Every client and worker sees the same pins, so a trajectory's actions always reach the node that
holds its environment.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import redis

from tangram_celery import keys
from tangram_celery.connection import durable, idempotent
from tangram_celery.tasks.clock import broker_time


@dataclass(frozen=True)
class NodeView:
    """What the registry holds of one CPU node: its size, reservations and liveness."""

    name: str
    cores: int
    free_cores: int
    memory_mb: float
    reserved_mb: float
    alive: bool = True
    trajectories: int = 0
    """Trajectories pinned to the node now."""
    starting: bool = False
    isolation: str = ""
    """How the node's sandbox holds the limits (see :mod:`tangram_celery.sandbox.isolation`)."""
    """Announced by an autoscaler that is starting it; its worker has not registered yet."""

    @property
    def free_memory_mb(self) -> float:
        """Memory not yet reserved by pinned trajectories."""
        return self.memory_mb - self.reserved_mb

    def trajectory_load_after(self) -> float:
        """Pinned trajectories per core once one more is placed on the node."""
        return (self.trajectories + 1) / self.cores if self.cores > 0 else float("inf")

    def memory_load_after(self, extra_mb: float) -> float:
        """Fraction of the node's memory reserved once ``extra_mb`` more is placed on it."""
        return (self.reserved_mb + extra_mb) / self.memory_mb if self.memory_mb > 0 else 1.0

PIN_SCRIPT = idempotent("""
local current = redis.call('GET', KEYS[1])
if current then
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  return current
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
redis.call('HINCRBYFLOAT', KEYS[3], 'reserved_mb', ARGV[2])
redis.call('SADD', KEYS[4], ARGV[4])
return ARGV[1]
""")

UNPIN_SCRIPT = idempotent("""
local node = redis.call('GET', KEYS[1])
if not node then return false end
local mem = redis.call('GET', KEYS[2]) or '0'
redis.call('DEL', KEYS[1], KEYS[2])
local node_key = ARGV[1] .. node
if redis.call('EXISTS', node_key) == 1 then
  redis.call('HINCRBYFLOAT', node_key, 'reserved_mb', -tonumber(mem))
end
redis.call('SREM', node_key .. ':trajectories', ARGV[2])
return node
""")


class Registry:
    """Node registration, heartbeats and trajectory pinning over one Redis connection."""

    def __init__(self, client: redis.Redis, node_ttl_s: float, trajectory_ttl_s: int) -> None:
        self._redis = client
        self._node_ttl_s = node_ttl_s
        self._trajectory_ttl_s = trajectory_ttl_s
        self._pin = client.register_script(PIN_SCRIPT)
        self._unpin = client.register_script(UNPIN_SCRIPT)

    def register_node(self, name: str, cores: int, memory_mb: float,
                      isolation: str = "") -> None:
        """Announce a CPU node (or refresh it after a restart, keeping its reservations), with
        what its sandbox enforces."""
        key = keys.node(name)
        pipe = self._redis.pipeline()
        pipe.hset(key, mapping={"cores": cores, "memory_mb": memory_mb, "free_cores": cores,
                                "isolation": isolation})
        pipe.hsetnx(key, "reserved_mb", 0)
        pipe.hset(key, "heartbeat", broker_time(self._redis))
        pipe.hdel(key, "starting")
        pipe.sadd(keys.NODES, name)
        pipe.execute()

    def announce_node(self, name: str, cores: int, memory_mb: float, alive_for_s: float) -> None:
        """Announce a node an autoscaler is starting, alive for ``alive_for_s`` seconds unless
        its worker registers first, so new trajectories are pinned to it at once (their actions
        wait in its queue while it starts) instead of piling onto the busy nodes."""
        key = keys.node(name)
        pipe = self._redis.pipeline()
        pipe.hset(key, mapping={"cores": cores, "memory_mb": memory_mb, "free_cores": cores,
                                "starting": 1,
                                "heartbeat": broker_time(self._redis) + alive_for_s
                                - self._node_ttl_s})
        pipe.hsetnx(key, "reserved_mb", 0)
        pipe.sadd(keys.NODES, name)
        pipe.execute()

    def heartbeat(self, name: str, free_cores: int,
                  decisions: tuple[int, float] | None = None,
                  durable: Mapping[str, Mapping[str, int]] | None = None) -> None:
        """Mark a node alive now, with its current free cores and, if given, its scheduler's
        calls and wall seconds so far and its process's durable writes
        (:data:`~tangram_celery.connection.DURABILITY`)."""
        pipe = self._redis.pipeline()
        pipe.hset(keys.node(name), "heartbeat", broker_time(self._redis))
        pipe.hset(keys.node(name), "free_cores", free_cores)
        if decisions is not None:
            pipe.hset(keys.node(name), mapping={"decide_calls": decisions[0],
                                                "decide_s": repr(decisions[1])})
        if durable:
            pipe.hset(keys.node(name), "durable", json.dumps(durable))
        pipe.execute()

    def decisions(self, names: Iterable[str]) -> tuple[int, float]:
        """The scheduler calls and wall seconds the nodes ``names`` reported last, summed."""
        calls, seconds = 0, 0.0
        for name in names:
            raw = self._redis.hmget(keys.node(name), ["decide_calls", "decide_s"])
            calls += int(raw[0] or 0)
            seconds += float(raw[1] or 0.0)
        return calls, seconds

    def deregister_node(self, name: str) -> None:
        """Mark a node gone: clients stop routing new trajectories to it."""
        self._redis.hset(keys.node(name), "heartbeat", 0)

    def nodes(self, now: float | None = None) -> list[NodeView]:
        """Every registered node, with liveness judged by heartbeat age on the broker's clock
        (``now`` defaults to Redis ``TIME``: heartbeats are stamped with it, so no two hosts'
        clocks are compared)."""
        now = broker_time(self._redis) if now is None else now
        names = sorted(_text(n) for n in self._redis.smembers(keys.NODES))
        pipe = self._redis.pipeline()
        for name in names:
            pipe.hgetall(keys.node(name))
            pipe.scard(keys.node_trajectories(name))
        replies = pipe.execute()
        return [
            _node_view(name, raw, int(pinned), now, self._node_ttl_s)
            for name, raw, pinned in zip(names, replies[::2], replies[1::2], strict=True)
            if raw
        ]

    def record_allocation(self, name: str, record: Mapping[str, Any], keep: int = 100_000) -> None:
        """Append a closed allocation of node ``name`` to its audit list (bounded)."""
        pipe = self._redis.pipeline()
        pipe.lpush(keys.node_allocations(name), json.dumps(record))
        pipe.ltrim(keys.node_allocations(name), 0, keep - 1)
        pipe.execute()

    def allocations(self, name: str) -> list[dict[str, Any]]:
        """Every recorded allocation of node ``name``, oldest first."""
        raw = self._redis.lrange(keys.node_allocations(name), 0, -1)
        return [json.loads(r) for r in reversed(raw)]

    def pinned_node(self, trajectory_id: str) -> str | None:
        """The node a trajectory is pinned to, if any."""
        raw = self._redis.get(keys.trajectory_pin(trajectory_id))
        return _text(raw) if raw is not None else None

    def pin(self, trajectory_id: str, node: str, memory_mb: float) -> str:
        """Pin a trajectory to ``node``, reserving ``memory_mb`` there, unless it is pinned
        already; returns the node it is pinned to (another client's choice wins a race).

        The check and the reservation are one atomic script, so concurrent clients agree and the
        memory is reserved once, and on a replica before this returns when Redis has one
        (:func:`~tangram_celery.connection.durable`). Choosing the node is the routing
        decision's (:func:`tangram_celery.client.routing.route`).
        """
        [result] = durable(self._redis, "pin", lambda pipe: self._pin(
            keys=[
                keys.trajectory_pin(trajectory_id),
                keys.trajectory_memory(trajectory_id),
                keys.node(node),
                keys.node_trajectories(node),
            ],
            args=[node, memory_mb, self._trajectory_ttl_s, trajectory_id],
            client=pipe,
        ))
        return result.decode() if isinstance(result, bytes) else str(result)

    def refresh_pin(self, trajectory_id: str) -> None:
        """Keep a trajectory's pin for another ``trajectory_ttl_s`` seconds."""
        self._redis.expire(keys.trajectory_pin(trajectory_id), self._trajectory_ttl_s)

    def unpin(self, trajectory_id: str) -> str | None:
        """Drop a trajectory's pin and give its memory back; returns the node it was on."""
        result = self._unpin(
            keys=[keys.trajectory_pin(trajectory_id), keys.trajectory_memory(trajectory_id)],
            args=[keys.node(""), trajectory_id],
        )
        return result.decode() if isinstance(result, bytes) else None


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def _node_view(name: str, raw: Mapping[bytes, bytes], pinned: int, now: float,
               ttl_s: float) -> NodeView:
    fields: dict[str, Any] = {k.decode(): v.decode() for k, v in raw.items()}
    heartbeat = float(fields.get("heartbeat", 0))
    return NodeView(
        name=name,
        cores=int(fields.get("cores", 0)),
        free_cores=int(fields.get("free_cores", 0)),
        memory_mb=float(fields.get("memory_mb", 0)),
        reserved_mb=float(fields.get("reserved_mb", 0)),
        alive=now - heartbeat <= ttl_s,
        trajectories=pinned,
        starting=fields.get("starting") == "1",
        isolation=fields.get("isolation", ""),
    )
