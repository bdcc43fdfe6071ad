"""The basic manager's Redis edge: the Lua scripts and the store that runs them.

:class:`QuotaStore` keeps the tickets, token buckets and leases of every API in Redis; its acquire
script implements :func:`~tangram_celery.managers.basic.policy.decide` atomically. A grant is on a
replica before the call it allows is made, when Redis has one
(:func:`~tangram_celery.connection.durable`); the register and renew scripts are idempotent and
retried across a failover, the acquire script is sent once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from tangram_celery import keys
from tangram_celery.connection import durable, idempotent
from tangram_celery.errors import ConfigError
from tangram_celery.managers.basic.limits import ApiSpec, Need
from tangram_celery.managers.basic.policy import ApiState, Decision
from tangram_celery.scheduling.ordering import DEFAULT_BYPASS_S

TRAJECTORY_IDLE_S = 3600.0
"""A trajectory that queued no API call for this long (past the bypass bound) counts as new."""


_CLOCK = """
local function clock(raw)
  if raw ~= '' then return tonumber(raw) end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
"""

REGISTER_SCRIPT = idempotent(_CLOCK + """
-- KEYS: the trajectory's first-seen time, then (tickets, deadlines) per API
-- ARGV: now, ticket, bypass_s, first-seen ttl, then ttl per API
-- The score is scheduling.ordering.trajectory_order_key(first seen, now, bypass_s).
local now = clock(ARGV[1])
redis.call('SET', KEYS[1], string.format('%.6f', now), 'NX')
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
local first = math.min(tonumber(redis.call('GET', KEYS[1])), now)
local score = string.format('%.6f', math.max(first, now - tonumber(ARGV[3])))
for i = 0, (#KEYS - 1) / 2 - 1 do
  redis.call('ZADD', KEYS[2 + 2 * i], score, ARGV[2])
  redis.call('ZADD', KEYS[3 + 2 * i], now + tonumber(ARGV[5 + i]), ARGV[2])
end
return score
""")

ACQUIRE_SCRIPT = _CLOCK + """
-- KEYS: (bucket, leases, tickets, deadlines) per API
-- ARGV: now, ticket, then (amount, capacity, rate, concurrency, ttl) per API; -1 = no limit
local now = clock(ARGV[1])
local ticket = ARGV[2]
local n = #KEYS / 4
local reason, where, wait = '', '', 0
local levels = {}
for i = 0, n - 1 do
  local bucket, leases, tickets, deadlines = KEYS[4*i+1], KEYS[4*i+2], KEYS[4*i+3], KEYS[4*i+4]
  local amount, cap = tonumber(ARGV[3+5*i]), tonumber(ARGV[4+5*i])
  local rate, conc = tonumber(ARGV[5+5*i]), tonumber(ARGV[6+5*i])
  local dead = redis.call('ZRANGEBYSCORE', deadlines, '-inf', now)
  for _, t in ipairs(dead) do
    redis.call('ZREM', tickets, t)
    redis.call('ZREM', deadlines, t)
  end
  if not redis.call('ZSCORE', tickets, ticket) then
    return {0, 'lost', tostring(i), '0'}
  end
  if redis.call('ZRANGE', tickets, 0, 0)[1] ~= ticket and reason == '' then
    reason, where = 'order', tostring(i)
  end
  if cap >= 0 then
    local state = redis.call('HMGET', bucket, 'tokens', 'ts')
    local level = cap
    if state[1] then
      level = math.min(cap, tonumber(state[1]) + math.max(now - tonumber(state[2]), 0) * rate)
    end
    levels[i] = level
    if level < amount then
      wait = math.max(wait, (amount - level) / rate)
      if reason == '' then reason, where = 'tokens', tostring(i) end
    end
  end
  if conc >= 0 then
    redis.call('ZREMRANGEBYSCORE', leases, '-inf', now)
    if redis.call('ZCARD', leases) + amount > conc and reason == '' then
      reason, where = 'leases', tostring(i)
    end
  end
end
if reason ~= '' then
  return {0, reason, where, string.format('%.6f', wait)}
end
for i = 0, n - 1 do
  local bucket, leases, tickets, deadlines = KEYS[4*i+1], KEYS[4*i+2], KEYS[4*i+3], KEYS[4*i+4]
  local amount, cap = tonumber(ARGV[3+5*i]), tonumber(ARGV[4+5*i])
  local rate, conc, ttl = tonumber(ARGV[5+5*i]), tonumber(ARGV[6+5*i]), tonumber(ARGV[7+5*i])
  if cap >= 0 then
    redis.call('HSET', bucket, 'tokens', string.format('%.9f', levels[i] - amount),
               'ts', string.format('%.6f', now))
    redis.call('EXPIRE', bucket, math.ceil(cap / rate) + 60)
  end
  if conc >= 0 then
    for k = 1, amount do
      redis.call('ZADD', leases, now + ttl, ticket .. '#' .. k)
    end
  end
  redis.call('ZREM', tickets, ticket)
  redis.call('ZREM', deadlines, ticket)
end
return {1, '', '', '0'}
"""

RENEW_SCRIPT = idempotent(_CLOCK + """
-- KEYS: sorted sets scored by expiry; ARGV: now, ttl, then one member list per key as
-- 'mode, count, m1, m2, ...'. Mode 'XX' renews only members still present (waiting tickets);
-- 'ADD' writes them again (held leases: their holder knows they are held, even when a
-- failover lost them).
local now = clock(ARGV[1])
local ttl = tonumber(ARGV[2])
local pos = 3
for k = 1, #KEYS do
  local mode, count = ARGV[pos], tonumber(ARGV[pos + 1])
  for j = 1, count do
    if mode == 'XX' then
      redis.call('ZADD', KEYS[k], 'XX', now + ttl, ARGV[pos + 1 + j])
    else
      redis.call('ZADD', KEYS[k], now + ttl, ARGV[pos + 1 + j])
    end
  end
  pos = pos + count + 2
end
return 1
""")


@dataclass(frozen=True)
class Grant:
    """Resources an action holds: its ticket names its leases (``ticket#k``)."""

    ticket: str
    needs: tuple[Need, ...]
    granted_at: float


class QuotaStore:
    """The Redis side of the basic manager: tickets, token buckets and leases of every API."""

    def __init__(self, client: redis.Redis, specs: Mapping[str, ApiSpec],
                 bypass_s: float = DEFAULT_BYPASS_S) -> None:
        if bypass_s < 0:
            raise ConfigError(f"TANGRAM_API_BYPASS_S={bypass_s!r}: must be >= 0 "
                              "(0: plain FCFS by arrival)")
        self._redis = client
        self.specs = dict(specs)
        self.bypass_s = bypass_s
        self._register = client.register_script(REGISTER_SCRIPT)
        self._acquire = client.register_script(ACQUIRE_SCRIPT)
        self._renew = client.register_script(RENEW_SCRIPT)

    def register(self, ticket: str, needs: Sequence[Need], now: float | None = None,
                 trajectory: str | None = None) -> float:
        """Queue ``ticket`` (a call of ``trajectory``; default: a trajectory of its own) in each
        API it needs at its place in the order; returns that place (its score, the same in
        every API, so tickets order alike everywhere and the first one is first everywhere)."""
        key_list = [keys.api_trajectory_seen(trajectory or ticket)]
        ttls = []
        for need in needs:
            key_list += [keys.api_tickets(need.api), keys.api_ticket_deadlines(need.api)]
            ttls.append(self.specs[need.api].lease_s)
        seen_ttl = math.ceil(self.bypass_s + TRAJECTORY_IDLE_S)
        score = self._register(keys=key_list,
                               args=[_now_arg(now), ticket, repr(self.bypass_s), seen_ttl, *ttls])
        return float(_text(score))

    def try_acquire(self, ticket: str, needs: Sequence[Need],
                    now: float | None = None) -> Decision:
        """Take every need of ``ticket`` at once if :func:`decide` allows it, else nothing."""
        if not needs:
            return Decision(True)
        key_list: list[str] = []
        args: list[Any] = [_now_arg(now), ticket]
        for need in needs:
            spec = self.specs[need.api]
            key_list += [keys.api_tokens(need.api), keys.api_leases(need.api),
                         keys.api_tickets(need.api), keys.api_ticket_deadlines(need.api)]
            quota = spec.quota
            args += [
                need.amount,
                -1 if quota is None else quota.capacity,
                0 if quota is None else repr(quota.rate_per_s),
                -1 if spec.concurrency is None else spec.concurrency,
                repr(spec.lease_s),
            ]
        [(granted, reason, where, wait)] = durable(self._redis, "quota", lambda pipe: (
            self._acquire(keys=key_list, args=args, client=pipe)))
        api = needs[int(where)].api if _text(where) else ""
        return Decision(bool(int(granted)), _text(reason), api, float(_text(wait)))

    def renew(self, waiting: Iterable[tuple[str, Sequence[Need]]],
              held: Iterable[Grant], now: float | None = None) -> None:
        """Push back the expiry of waiting tickets (those still present) and held leases
        (written again if a failover lost them)."""
        members: dict[tuple[str, float], list[str]] = {}
        leases: set[str] = set()
        for ticket, needs in waiting:
            for need in needs:
                ttl = self.specs[need.api].lease_s
                members.setdefault((keys.api_ticket_deadlines(need.api), ttl), []).append(ticket)
        for grant in held:
            for need in grant.needs:
                if self.specs[need.api].concurrency is None:
                    continue
                ttl = self.specs[need.api].lease_s
                leases.add(keys.api_leases(need.api))
                members.setdefault((keys.api_leases(need.api), ttl), []).extend(
                    _lease_members(grant.ticket, need.amount))
        by_ttl: dict[float, list[tuple[str, list[str]]]] = {}
        for (key, ttl), names in members.items():
            by_ttl.setdefault(ttl, []).append((key, names))
        for ttl, groups in by_ttl.items():
            args: list[Any] = [_now_arg(now), repr(ttl)]
            for key, names in groups:
                args += ["ADD" if key in leases else "XX", len(names), *names]
            self._renew(keys=[key for key, _ in groups], args=args)

    def release(self, grant: Grant) -> None:
        """Give back the concurrency slots of a grant (tokens are spent for good)."""
        pipe = self._redis.pipeline()
        for need in grant.needs:
            if self.specs[need.api].concurrency is not None:
                pipe.zrem(keys.api_leases(need.api), *_lease_members(grant.ticket, need.amount))
        pipe.execute()

    def cancel(self, ticket: str, needs: Sequence[Need]) -> None:
        """Withdraw a waiting ticket from every API it queued in."""
        pipe = self._redis.pipeline()
        for need in needs:
            pipe.zrem(keys.api_tickets(need.api), ticket)
            pipe.zrem(keys.api_ticket_deadlines(need.api), ticket)
        pipe.execute()

    def state(self, api: str) -> ApiState:
        """The raw state of one API as plain data (for inspection and tests)."""
        pipe = self._redis.pipeline()
        pipe.hmget(keys.api_tokens(api), "tokens", "ts")
        pipe.zrange(keys.api_leases(api), 0, -1, withscores=True)
        pipe.zrange(keys.api_tickets(api), 0, -1)
        pipe.zrange(keys.api_ticket_deadlines(api), 0, -1, withscores=True)
        bucket, leases, tickets, deadlines = pipe.execute()
        expiry = {_text(t): float(s) for t, s in deadlines}
        return ApiState(
            tokens=None if bucket[0] is None else float(bucket[0]),
            refilled_at=0.0 if bucket[1] is None else float(bucket[1]),
            leases=tuple(float(s) for _, s in leases),
            tickets=tuple((_text(t), expiry.get(_text(t), 0.0)) for t in tickets),
        )

    def load(self, api: str, state: ApiState) -> None:
        """Overwrite the Redis state of one API (tests and operators' resets)."""
        pipe = self._redis.pipeline()
        for key in (keys.api_tokens(api), keys.api_leases(api), keys.api_tickets(api),
                    keys.api_ticket_deadlines(api)):
            pipe.delete(key)
        if state.tokens is not None:
            pipe.hset(keys.api_tokens(api),
                      mapping={"tokens": repr(state.tokens), "ts": repr(state.refilled_at)})
        for k, expiry in enumerate(state.leases):
            pipe.zadd(keys.api_leases(api), {f"loaded-{k}#1": expiry})
        for seq, (ticket, deadline) in enumerate(state.tickets):
            pipe.zadd(keys.api_tickets(api), {ticket: seq})
            pipe.zadd(keys.api_ticket_deadlines(api), {ticket: deadline})
        pipe.execute()


def _lease_members(ticket: str, amount: int) -> list[str]:
    return [f"{ticket}#{k}" for k in range(1, amount + 1)]


def _now_arg(now: float | None) -> str:
    return "" if now is None else repr(now)


def _text(raw: bytes | str | int) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)
