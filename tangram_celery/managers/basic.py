"""The basic manager: API concurrency caps and quotas, enforced across all workers and hosts.

An *API* is a basic resource: it cannot scale, it has a concurrency cap, a quota per period, or
both. Limits are declared in ``TANGRAM_API_LIMITS`` (format below) and enforced in Redis, so every
worker on every host draws from the same budget:

* **quota**: a token bucket per API (hash ``keys.api_tokens``), refilled continuously;
* **concurrency**: leases in a sorted set scored by expiry (``keys.api_leases``), renewed while
  the action runs, so a slot held by a worker that died comes back after the lease TTL;
* **order**: every waiting action holds a *ticket* in each API it needs (``keys.api_tickets``),
  scored by its place in one global order, and only the first live ticket of an API may take
  from it. The order is *oldest trajectory first*
  (:func:`~tangram_celery.scheduling.ordering.trajectory_order_key`): a call ranks by when its
  trajectory's first call was queued (``keys.api_trajectory_seen``), so trajectories under way
  finish and leave instead of all of a batch's trajectories crawling to the end together, which
  cuts the sum of ACT of a quota-bound batch. No call ranks later than its own arrival less
  ``TANGRAM_API_BYPASS_S`` (default 60 s), so a call is overtaken only by calls that arrived at
  most that long after it, and nobody waits forever; ``0`` is plain FCFS by arrival, the paper's
  order. The price is a longer tail, and a step shorter than a few bounds can end later (its
  youngest trajectories start late); ``python -m tangram_celery.bench.api`` measures both orders.
  Tickets expire like leases when their worker stops renewing them.

An action whose cost names several APIs starts only when it is at the head of every one of them
and all of them have room: one Lua script checks every API and takes from all or from none.
Actions never fail or retry into a limit: they wait (in the worker, in that order) until the
script says yes.

``TANGRAM_API_LIMITS`` format: ``;``-separated entries ``name=field:value,field:value``::

    search=url:http://127.0.0.1:8080,concurrency:4,rate:10/1s;judge=url:https://j.example/v1,rate:600/1m,burst:20

* ``url`` (required): the API's base URL (``http``/``https``, no query, no credentials, no ``,``
  or ``;``). Workers only ever call paths below it; a payload never names a host.
* ``concurrency``: at most this many calls in flight at once, over all workers.
* ``rate``: the provider's quota ``N/PERIOD``: ``N`` calls per period, refilled continuously;
  ``PERIOD`` is ``250ms``, ``1s``, ``1m``, ``1h`` or plain seconds (``1`` means ``1/1s``).
* ``burst``: the provider's bucket size, default ``N``. The manager's own bucket holds
  ``burst - 1`` tokens (at least 1): one token of headroom absorbs the jitter between a grant in
  Redis and the request's arrival at the provider.
* ``lease``: TTL of leases and waiting tickets (default ``10s``); renewed every third of it.

At least one of ``concurrency`` and ``rate`` is required. For a provider that counts calls in
fixed or sliding windows rather than a bucket, declare ``rate:<N-1>/PERIOD,burst:1``.

Policy is pure (:func:`parse_api_limits`, :func:`needs_of`, :func:`decide`, :func:`pause_for`);
:class:`QuotaStore` is the Redis actuator (its Lua script implements :func:`decide` atomically,
and the tests check both agree case by case); :class:`ApiGate` is the worker-side waiting
room that asks the store on behalf of its first waiter in that order.
"""

from __future__ import annotations

import bisect
import functools
import logging
import math
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import redis

from tangram_celery import keys
from tangram_celery.action import API_PATTERN, Action
from tangram_celery.errors import ConfigError, ServiceError, ValidationError
from tangram_celery.scheduling.ordering import DEFAULT_BYPASS_S

log = logging.getLogger(__name__)

SETTING = "TANGRAM_API_LIMITS"
DEFAULT_LEASE_S = 10.0
TRAJECTORY_IDLE_S = 3600.0
"""A trajectory that queued no API call for this long (past the bypass bound) counts as new."""
FIELDS = frozenset({"url", "concurrency", "rate", "burst", "lease"})
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}

# Decision reasons, also returned by the Lua script.
GRANTED = ""
ORDER = "order"
TOKENS = "tokens"
LEASES = "leases"
LOST = "lost"


# --------------------------------------------------------------------------- declarations


@dataclass(frozen=True)
class Quota:
    """A provider's quota: ``count`` calls per ``period_s``, bucket size ``burst``."""

    count: int
    period_s: float
    burst: int

    @property
    def rate_per_s(self) -> float:
        """Tokens added per second."""
        return self.count / self.period_s

    @property
    def capacity(self) -> int:
        """Size of the manager's bucket: ``burst - 1`` (one token of headroom), at least 1."""
        return max(1, self.burst - 1)


@dataclass(frozen=True)
class ApiSpec:
    """One declared API: where it lives and what it allows."""

    name: str
    base_url: str
    concurrency: int | None = None
    quota: Quota | None = None
    lease_s: float = DEFAULT_LEASE_S

    def max_amount(self) -> int | None:
        """The largest amount one action may ask of this API (None: unbounded)."""
        bounds = [b for b in (self.concurrency,
                              None if self.quota is None else self.quota.capacity) if b]
        return min(bounds) if bounds else None


def parse_duration(raw: str) -> float:
    """Seconds in ``250ms``, ``1s``, ``2m``, ``1h`` or a plain number of seconds."""
    match = _DURATION.match(raw)
    if match is None:
        raise ValueError(f"{raw!r} is not a duration like 500ms, 1s, 1m or 1h")
    seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"{raw!r} must be longer than zero")
    return seconds


def parse_api_limits(text: str) -> dict[str, ApiSpec]:
    """Parse ``TANGRAM_API_LIMITS`` (see the module docstring) into specs by API name.

    Raises :class:`ConfigError` naming the entry and what is wrong with it.
    """
    specs: dict[str, ApiSpec] = {}
    for entry in (e.strip() for e in text.split(";")):
        if not entry:
            continue
        spec = _parse_entry(entry)
        if spec.name in specs:
            raise ConfigError(f"{SETTING}: API {spec.name!r} is declared twice")
        specs[spec.name] = spec
    return specs


def _parse_entry(entry: str) -> ApiSpec:
    name, sep, body = entry.partition("=")
    name = name.strip()
    if not sep or not API_PATTERN.fullmatch(name):
        raise ConfigError(f"{SETTING}: {entry!r}: expected name=field:value,... with a name of "
                          "1-64 characters a-z 0-9 _ -")
    values: dict[str, str] = {}
    for item in (i.strip() for i in body.split(",")):
        key, colon, value = item.partition(":")
        key = key.strip()
        if not colon or key not in FIELDS or key in values:
            raise ConfigError(f"{SETTING}: API {name!r}: bad or repeated field {item!r}; "
                              f"fields are {sorted(FIELDS)} as field:value")
        values[key] = value.strip()
    try:
        return _spec(name, values)
    except ValueError as exc:
        raise ConfigError(f"{SETTING}: API {name!r}: {exc}") from None


def _spec(name: str, values: Mapping[str, str]) -> ApiSpec:
    if "url" not in values:
        raise ValueError("url:<base URL> is required")
    if "concurrency" not in values and "rate" not in values:
        raise ValueError("declare concurrency:N, rate:N/PERIOD or both")
    quota = None
    if "rate" in values:
        quota = _quota(values["rate"], values.get("burst"))
    elif "burst" in values:
        raise ValueError("burst needs a rate")
    concurrency = _positive_int("concurrency", values["concurrency"]) \
        if "concurrency" in values else None
    lease = parse_duration(values["lease"]) if "lease" in values else DEFAULT_LEASE_S
    return ApiSpec(name, _base_url(values["url"]), concurrency, quota, lease)


def _quota(rate: str, burst: str | None) -> Quota:
    count, slash, period = rate.partition("/")
    calls = _positive_int("rate", count)
    period_s = parse_duration(period) if slash else 1.0
    size = _positive_int("burst", burst) if burst is not None else calls
    return Quota(calls, period_s, size)


def _positive_int(what: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{what}: {raw!r} is not a whole number") from None
    if value < 1:
        raise ValueError(f"{what}: must be at least 1")
    return value


def _base_url(raw: str) -> str:
    parts = urlsplit(raw)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValueError(f"url: {raw!r} must be http(s)://host[:port][/prefix]")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"url: {raw!r} must have no query, fragment or credentials")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValueError(f"url: {raw!r} has a bad port") from None
    return raw.rstrip("/")


# --------------------------------------------------------------------------- pure policy


@dataclass(frozen=True)
class Need:
    """What one action takes from one API: ``amount`` tokens and ``amount`` concurrency slots."""

    api: str
    amount: int


def needs_of(action: Action, specs: Mapping[str, ApiSpec]) -> tuple[Need, ...]:
    """The API needs of an action, sorted by API name (zero amounts dropped).

    Raises :class:`ValidationError` for an undeclared API or an amount no API could ever grant.
    """
    needs = []
    for api in action.apis():
        spec = specs.get(api)
        if spec is None:
            raise ValidationError(f"cost.api:{api}", f"API not declared in {SETTING}")
        amount = int(action.cost[f"api:{api}"].min)
        bound = spec.max_amount()
        if bound is not None and amount > bound:
            raise ValidationError(
                f"cost.api:{api}",
                f"{amount} exceeds what the API can ever grant at once ({bound}); lower it",
            )
        if amount > 0:
            needs.append(Need(api, amount))
    return tuple(needs)


def refill(tokens: float | None, refilled_at: float, now: float, quota: Quota) -> float:
    """Token level of a bucket at ``now`` (``tokens=None``: a bucket never used, so full)."""
    if tokens is None:
        return float(quota.capacity)
    elapsed = max(now - refilled_at, 0.0)
    return min(float(quota.capacity), tokens + elapsed * quota.rate_per_s)


@dataclass(frozen=True)
class ApiState:
    """The Redis state of one API as plain data (what :func:`decide` reads)."""

    tokens: float | None = None
    refilled_at: float = 0.0
    leases: tuple[float, ...] = ()
    tickets: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Decision:
    """Whether a ticket may start now; if not, why (first blocker) and a lower bound on the wait
    for tokens in seconds."""

    granted: bool
    reason: str = GRANTED
    api: str = ""
    wait_s: float = 0.0


def decide(
    ticket: str,
    needs: Sequence[Need],
    specs: Mapping[str, ApiSpec],
    states: Mapping[str, ApiState],
    now: float,
) -> Decision:
    """May ``ticket`` take ``needs`` now? The same rule as the Lua script, on plain data.

    For each API in order: expired tickets and leases are ignored; a ticket that is gone is
    ``lost``; otherwise the ticket must be the first live one (``order``), the bucket must hold
    the amount (``tokens``, with the time until it will) and the live leases plus the amount must
    fit the cap (``leases``). Granted only when no API blocks.
    """
    blocker: tuple[str, str] | None = None
    wait = 0.0
    for need in needs:
        spec, state = specs[need.api], states.get(need.api, ApiState())
        live = [t for t, deadline in state.tickets if deadline > now]
        if ticket not in live:
            return Decision(False, LOST, need.api)
        if live[0] != ticket:
            blocker = blocker or (ORDER, need.api)
        if spec.quota is not None:
            level = refill(state.tokens, state.refilled_at, now, spec.quota)
            if level < need.amount:
                wait = max(wait, (need.amount - level) / spec.quota.rate_per_s)
                blocker = blocker or (TOKENS, need.api)
        if spec.concurrency is not None:
            held = sum(1 for expiry in state.leases if expiry > now)
            if held + need.amount > spec.concurrency:
                blocker = blocker or (LEASES, need.api)
    if blocker is not None:
        return Decision(False, blocker[0], blocker[1], wait)
    return Decision(True)


def pause_for(decision: Decision, poll_s: float, max_pause_s: float) -> float:
    """How long the gate waits before asking again after a refusal.

    Tokens refill on a known schedule, so a ``tokens`` refusal sleeps exactly until they are
    back; ``order`` and ``leases`` depend on other workers, so they poll (never sooner than the
    token wait); ``lost`` retries at once after re-registering.
    """
    if decision.granted or decision.reason == LOST:
        return 0.0
    pause = decision.wait_s if decision.reason == TOKENS else max(decision.wait_s, poll_s)
    return min(max(pause, 0.0005), max_pause_s)


# --------------------------------------------------------------------------- Redis actuator

_CLOCK = """
local function clock(raw)
  if raw ~= '' then return tonumber(raw) end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
"""

REGISTER_SCRIPT = _CLOCK + """
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
"""

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

RENEW_SCRIPT = _CLOCK + """
-- KEYS: sorted sets scored by expiry; ARGV: now, ttl, then one member list per key as
-- 'count, m1, m2, ...'. Only members still present are renewed (ZADD XX).
local now = clock(ARGV[1])
local ttl = tonumber(ARGV[2])
local pos = 3
for k = 1, #KEYS do
  local count = tonumber(ARGV[pos])
  for j = 1, count do
    redis.call('ZADD', KEYS[k], 'XX', now + ttl, ARGV[pos + j])
  end
  pos = pos + count + 1
end
return 1
"""


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
        granted, reason, where, wait = self._acquire(keys=key_list, args=args)
        api = needs[int(where)].api if _text(where) else ""
        return Decision(bool(int(granted)), _text(reason), api, float(_text(wait)))

    def renew(self, waiting: Iterable[tuple[str, Sequence[Need]]],
              held: Iterable[Grant], now: float | None = None) -> None:
        """Push back the expiry of waiting tickets and held leases (those still present)."""
        members: dict[tuple[str, float], list[str]] = {}
        for ticket, needs in waiting:
            for need in needs:
                ttl = self.specs[need.api].lease_s
                members.setdefault((keys.api_ticket_deadlines(need.api), ttl), []).append(ticket)
        for grant in held:
            for need in grant.needs:
                if self.specs[need.api].concurrency is None:
                    continue
                ttl = self.specs[need.api].lease_s
                members.setdefault((keys.api_leases(need.api), ttl), []).extend(
                    _lease_members(grant.ticket, need.amount))
        by_ttl: dict[float, list[tuple[str, list[str]]]] = {}
        for (key, ttl), names in members.items():
            by_ttl.setdefault(ttl, []).append((key, names))
        for ttl, groups in by_ttl.items():
            args: list[Any] = [_now_arg(now), repr(ttl)]
            for _, names in groups:
                args += [len(names), *names]
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


# --------------------------------------------------------------------------- worker-side gate

POLL_S = 0.005
MAX_PAUSE_S = 0.25
ERROR_PAUSE_S = 0.1


@dataclass
class _Waiter:
    score: float
    ticket: str
    needs: tuple[Need, ...]
    event: threading.Event = field(default_factory=threading.Event)
    trajectory: str | None = None
    grant: Grant | None = None
    abandoned: bool = False
    error: BaseException | None = None


def _place(waiter: _Waiter) -> tuple[float, str]:
    """A waiter's place: its score, ties by ticket, as Redis orders a sorted set."""
    return waiter.score, waiter.ticket


class ApiGate:
    """A worker's waiting room for API actions, in the store's order.

    Threads call :meth:`acquire` and block; one pump thread asks the :class:`QuotaStore` on
    behalf of the first local waiter only (the store itself enforces the global order), sleeps
    as :func:`pause_for` says, and renews the tickets of waiters and the leases of running
    actions. :meth:`release` gives slots back and wakes the pump at once.
    """

    def __init__(
        self,
        store: QuotaStore,
        poll_s: float = POLL_S,
        max_pause_s: float = MAX_PAUSE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self._poll_s = poll_s
        self._max_pause_s = max_pause_s
        self._clock = clock
        leases = [s.lease_s for s in store.specs.values()] or [DEFAULT_LEASE_S]
        self._renew_every_s = min(leases) / 3
        self._lock = threading.Lock()
        self._waiting: list[_Waiter] = []
        self._held: dict[str, Grant] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the pump thread (idempotent; :meth:`acquire` starts it too)."""
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._pump, name="tangram-api-gate",
                                                daemon=True)
                self._thread.start()

    def stop(self) -> None:
        """Stop the pump; waiters still queued get :class:`ServiceError`, tickets withdrawn."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            self._safe(functools.partial(self.store.cancel, waiter.ticket, waiter.needs))
            waiter.error = ServiceError("the API worker is shutting down; resubmit the action")
            waiter.event.set()

    def waiting_count(self) -> int:
        """Actions of this worker waiting for their APIs."""
        with self._lock:
            return len(self._waiting)

    def held_count(self) -> int:
        """Actions of this worker holding their APIs."""
        with self._lock:
            return len(self._held)

    def acquire(self, action_id: str, needs: Sequence[Need],
                timeout: float | None = None, trajectory: str | None = None) -> Grant:
        """Block until the action (a call of ``trajectory``, whose place in the order it takes)
        may call its APIs; returns the grant to :meth:`release`.

        Raises ``TimeoutError`` after ``timeout`` seconds (the ticket is withdrawn) and
        :class:`ServiceError` if the worker stops first.
        """
        if self._stop.is_set():
            raise ServiceError("the API worker is shutting down; resubmit the action")
        ticket = f"{action_id}:{uuid.uuid4().hex[:8]}"
        if not needs:
            return Grant(ticket, (), self._clock())
        self.start()
        waiter = _Waiter(self.store.register(ticket, needs, trajectory=trajectory), ticket,
                         tuple(needs), trajectory=trajectory)
        with self._lock:
            bisect.insort(self._waiting, waiter, key=_place)
        self._wake.set()
        if not waiter.event.wait(timeout):
            with self._lock:
                if not waiter.event.is_set():
                    waiter.abandoned = True
                    if waiter in self._waiting:
                        self._waiting.remove(waiter)
            if waiter.abandoned:
                self.store.cancel(ticket, waiter.needs)
                raise TimeoutError(f"action {action_id} got no API slot within {timeout} s")
        if waiter.error is not None:
            raise waiter.error
        assert waiter.grant is not None
        return waiter.grant

    def release(self, grant: Grant) -> None:
        """Give a grant's concurrency slots back (safe to call once per grant)."""
        with self._lock:
            if self._held.pop(grant.ticket, None) is None:
                return
        self._safe(lambda: self.store.release(grant))
        self._wake.set()

    def _pump(self) -> None:
        next_renewal = self._clock() + self._renew_every_s
        while not self._stop.is_set():
            if self._clock() >= next_renewal:
                self._renew()
                next_renewal = self._clock() + self._renew_every_s
            with self._lock:
                head = self._waiting[0] if self._waiting else None
            pause = next_renewal - self._clock() if head is None else self._serve(head)
            if pause > 0:
                self._wake.wait(min(pause, max(next_renewal - self._clock(), 0.0)))
                self._wake.clear()

    def _serve(self, head: _Waiter) -> float:
        try:
            decision = self.store.try_acquire(head.ticket, head.needs)
            if decision.reason == LOST:
                self._requeue(head)
        except redis.RedisError:
            log.warning("API gate could not reach Redis; retrying", exc_info=True)
            return ERROR_PAUSE_S
        except Exception as exc:  # a bug must fail one action, not hang every waiter
            log.exception("API gate failed on ticket %s", head.ticket)
            self._fail(head, ServiceError(f"the API gate failed: {exc!r}"))
            return 0.0
        if decision.granted:
            self._hand_over(head)
            return 0.0
        return pause_for(decision, self._poll_s, self._max_pause_s)

    def _hand_over(self, head: _Waiter) -> None:
        grant = Grant(head.ticket, head.needs, self._clock())
        with self._lock:
            abandoned = head.abandoned
            if not abandoned:
                self._waiting.remove(head)
                self._held[grant.ticket] = grant
                head.grant = grant
                head.event.set()
        if abandoned:
            self._safe(lambda: self.store.release(grant))

    def _fail(self, head: _Waiter, error: ServiceError) -> None:
        with self._lock:
            if head in self._waiting:
                self._waiting.remove(head)
        self._safe(functools.partial(self.store.cancel, head.ticket, head.needs))
        head.error = error
        head.event.set()

    def _requeue(self, head: _Waiter) -> None:
        log.warning("ticket %s expired while waiting (worker stalled?); queueing it again",
                    head.ticket)
        with self._lock:
            if head not in self._waiting:
                return
        score = self.store.register(head.ticket, head.needs, trajectory=head.trajectory)
        with self._lock:
            still_waiting = head in self._waiting
            if still_waiting:
                self._waiting.remove(head)
                head.score = score
                bisect.insort(self._waiting, head, key=_place)
        if not still_waiting:  # it timed out meanwhile: leave no orphan ticket behind
            self.store.cancel(head.ticket, head.needs)

    def _renew(self) -> None:
        with self._lock:
            waiting = [(w.ticket, w.needs) for w in self._waiting]
            held = list(self._held.values())
        if waiting or held:
            self._safe(lambda: self.store.renew(waiting, held))

    @staticmethod
    def _safe(call: Callable[[], object]) -> None:
        try:
            call()
        except redis.RedisError:
            log.warning("basic manager: Redis call failed", exc_info=True)

