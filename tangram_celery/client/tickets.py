"""The queue of trajectories waiting for memory, in Redis, shared by every client.

A new trajectory is placed with one atomic script (:data:`PLACE_SCRIPT`): it is pinned to the node
the routing decision chose only when nobody waits ahead of it (strict FCFS) and that node still has
the memory unreserved; otherwise it gets a ticket, a place in line handed out by one counter, so
the order holds across clients. The waiting client renews its tickets' leases; the script drops a
ticket whose lease ran out (its client died) and hands it back, so the caller answers its actions
``client_lost`` instead of leaving them unanswered, and records it in
:data:`~tangram_celery.keys.MEMORY_ABANDONED`. The script is idempotent, and its pin or ticket is on
a replica before :meth:`MemoryTickets.place` returns when Redis has one
(:func:`~tangram_celery.connection.durable`), so a failover loses neither.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from tangram_celery import keys
from tangram_celery.connection import durable, idempotent

LEASE_S = 10.0
"""How long a ticket outlives its client's last renewal."""
KEEP = 1000
"""Entries kept in the admission and abandoned lists."""

PLACE_SCRIPT = idempotent("""
-- KEYS: pin, memory, node hash, node trajectories, tickets, leases, seq, info, admissions,
--       abandoned
-- ARGV: trajectory, node ('' = none fits now), memory_mb, pin ttl, lease_s, ticket json, keep
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local traj, node, memory = ARGV[1], ARGV[2], tonumber(ARGV[3])
local keep = tonumber(ARGV[7])
local dropped = {}
for _, dead in ipairs(redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', now)) do
  redis.call('ZREM', KEYS[5], dead)
  redis.call('ZREM', KEYS[6], dead)
  local info = redis.call('HGET', KEYS[8], dead)
  redis.call('HDEL', KEYS[8], dead)
  if info then
    redis.call('LPUSH', KEYS[10], info)
    table.insert(dropped, info)
  end
end
redis.call('LTRIM', KEYS[10], 0, keep - 1)
local function leave()
  redis.call('ZREM', KEYS[5], traj)
  redis.call('ZREM', KEYS[6], traj)
  redis.call('HDEL', KEYS[8], traj)
end
local current = redis.call('GET', KEYS[1])
if current then
  redis.call('EXPIRE', KEYS[1], ARGV[4])
  leave()
  return {'pinned', current, dropped}
end
local mine = redis.call('ZSCORE', KEYS[5], traj)
local head = redis.call('ZRANGE', KEYS[5], 0, 0)[1]
if node ~= '' and (head == nil or head == traj) then
  local held = redis.call('HMGET', KEYS[3], 'memory_mb', 'reserved_mb')
  if held[1] and tonumber(held[1]) - tonumber(held[2] or '0') >= memory then
    redis.call('SET', KEYS[1], node, 'EX', ARGV[4])
    redis.call('SET', KEYS[2], ARGV[3], 'EX', ARGV[4])
    redis.call('HINCRBYFLOAT', KEYS[3], 'reserved_mb', ARGV[3])
    redis.call('SADD', KEYS[4], traj)
    if mine then
      local since = cjson.decode(redis.call('HGET', KEYS[8], traj) or '{}')['since'] or now
      leave()
      redis.call('LPUSH', KEYS[9], cjson.encode({trajectory = traj, place = tonumber(mine),
                                                 node = node, waited_s = now - since}))
      redis.call('LTRIM', KEYS[9], 0, keep - 1)
    end
    return {'pinned', node, dropped}
  end
end
if not mine then
  mine = redis.call('INCR', KEYS[7])
  redis.call('ZADD', KEYS[5], mine, traj)
  local info = cjson.decode(ARGV[6])
  info['since'] = now
  info['place'] = mine
  redis.call('HSET', KEYS[8], traj, cjson.encode(info))
end
redis.call('ZADD', KEYS[6], now + tonumber(ARGV[5]), traj)
return {'queued', tostring(redis.call('ZRANK', KEYS[5], traj)), dropped}
""")

RENEW_SCRIPT = idempotent("""
-- KEYS: leases; ARGV: lease_s, then the trajectories. Renews those still waiting.
local t = redis.call('TIME')
local until_ = tonumber(t[1]) + tonumber(t[2]) / 1000000 + tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', until_, ARGV[i])
end
return 1
""")


@dataclass(frozen=True)
class Placement:
    """What :meth:`MemoryTickets.place` did: pinned to ``node``, or queued at ``ahead``."""

    node: str | None
    ahead: int
    dropped: tuple[dict[str, Any], ...] = ()
    """Tickets of dead clients dropped on the way (their JSON), to answer ``client_lost``."""


class MemoryTickets:
    """Places new trajectories on nodes, or in the shared FCFS line when memory is short."""

    def __init__(self, client: redis.Redis, trajectory_ttl_s: int, client_id: str,
                 lease_s: float = LEASE_S) -> None:
        self._redis = client
        self._ttl_s = trajectory_ttl_s
        self._client_id = client_id
        self.lease_s = lease_s
        self._place = client.register_script(PLACE_SCRIPT)
        self._renew = client.register_script(RENEW_SCRIPT)

    def ahead(self, trajectory_id: str) -> int:
        """How many trajectories wait before ``trajectory_id`` (all of them, if it waits not)."""
        pipe = self._redis.pipeline()
        pipe.zrank(keys.MEMORY_TICKETS, trajectory_id)
        pipe.zcard(keys.MEMORY_TICKETS)
        rank, count = pipe.execute()
        return int(count if rank is None else rank)

    def in_line_order(self, trajectory_ids: Iterable[str]) -> list[str]:
        """``trajectory_ids`` in the shared line's order (its ticket numbers, handed out by one
        counter); those holding no ticket (dropped, or never queued) come last, as given."""
        waiting = list(trajectory_ids)
        if not waiting:
            return []
        pipe = self._redis.pipeline()
        for trajectory_id in waiting:
            pipe.zscore(keys.MEMORY_TICKETS, trajectory_id)
        places = pipe.execute()
        unticketed = float("inf")
        return [t for _, t in sorted(
            ((unticketed if place is None else float(place), index), t)
            for index, (t, place) in enumerate(zip(waiting, places, strict=True)))]

    def place(self, trajectory_id: str, node: str | None, memory_mb: float,
              action_ids: Sequence[str]) -> Placement:
        """Pin the trajectory to ``node`` if it is first in line and the node has the memory,
        else queue it (or keep its place); ``node`` None queues it."""
        target = node or ""
        info = json.dumps({"trajectory": trajectory_id, "memory_mb": memory_mb,
                           "actions": list(action_ids), "client": self._client_id})
        [(status, value, dropped)] = durable(self._redis, "placement", lambda pipe: self._place(
            keys=[keys.trajectory_pin(trajectory_id), keys.trajectory_memory(trajectory_id),
                  keys.node(target), keys.node_trajectories(target), keys.MEMORY_TICKETS,
                  keys.MEMORY_TICKET_LEASES, keys.MEMORY_TICKET_SEQ, keys.MEMORY_TICKET_INFO,
                  keys.MEMORY_ADMISSIONS, keys.MEMORY_ABANDONED],
            args=[trajectory_id, target, memory_mb, self._ttl_s, self.lease_s, info, KEEP],
            client=pipe,
        ))
        gone = tuple(json.loads(raw) for raw in dropped)
        if _text(status) == "pinned":
            return Placement(_text(value), 0, gone)
        return Placement(None, int(_text(value)), gone)

    def renew(self, trajectory_ids: Iterable[str]) -> None:
        """Extend the leases of these waiting trajectories by ``lease_s``."""
        waiting = list(trajectory_ids)
        if waiting:
            self._renew(keys=[keys.MEMORY_TICKET_LEASES], args=[self.lease_s, *waiting])

    def withdraw(self, trajectory_id: str) -> None:
        """Leave the line (the trajectory gave up, ended, or its client closes)."""
        pipe = self._redis.pipeline()
        pipe.zrem(keys.MEMORY_TICKETS, trajectory_id)
        pipe.zrem(keys.MEMORY_TICKET_LEASES, trajectory_id)
        pipe.hdel(keys.MEMORY_TICKET_INFO, trajectory_id)
        pipe.execute()

    def admissions(self) -> list[dict[str, Any]]:
        """The trajectories placed after waiting, oldest first (at most ``KEEP``)."""
        raw = self._redis.lrange(keys.MEMORY_ADMISSIONS, 0, -1)
        return [json.loads(r) for r in reversed(raw)]


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)
