"""Exactly-once results over at-least-once delivery, and the dead-letter list.

Celery with late acks delivers an action again if its worker dies, and a Redis failover can hand
out a second copy of a message whose first delivery the new primary never saw. The ledger makes
the *result* idempotent: the first result stored for an action id wins (``SET NX``), a delivery
of an action that already has one gets it back without running again, and one that never
finished runs again with ``attempts`` saying how many times it was started. Before a delivery
runs it takes the action's *claim* (:meth:`Ledger.begin`, one idempotent script); a second copy
that finds the claim held by another delivery waits for that one's result instead of running
beside it. A claim lasts ``claim_s`` (the broker's visibility timeout, after which a dead
worker's message is delivered again). Results and claims are written :func:`durable`: under
Sentinel they are on a replica before the action starts or is acknowledged. Messages that
cannot be decoded at all go to a dead-letter list with their reason instead of vanishing.
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass
from typing import Any

import redis

from tangram_celery import keys
from tangram_celery.connection import durable, idempotent

DEAD_LETTER_BODY_CAP = 65536
DEAD_LETTER_MAX = 10000
STORE_RETRY_S = 60.0

CLAIM_SCRIPT = idempotent("""
-- KEYS: result, attempts, claim; ARGV: token, ttl, claim ttl
local stored = redis.call('GET', KEYS[1])
if stored then return {'stored', stored} end
local holder = redis.call('GET', KEYS[3])
if holder == ARGV[1] then return {'claimed', redis.call('GET', KEYS[2]) or '1'} end
if holder then return {'held', holder} end
redis.call('SET', KEYS[3], ARGV[1], 'EX', ARGV[3])
local attempt = redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return {'claimed', tostring(attempt)}
""")
"""Take an action's claim for one delivery (``token``), unless its result is stored or another
delivery holds the claim; run again with the same token it changes nothing."""


@dataclass(frozen=True)
class Start:
    """What :meth:`Ledger.begin` found: the result already stored, another delivery's claim, or
    the claim taken with this start's attempt number."""

    attempt: int = 0
    stored: dict[str, Any] | None = None
    holder: str = ""


class Ledger:
    """Stored results, claims and start counts of actions, in Redis."""

    def __init__(self, client: redis.Redis, ttl_s: int, claim_s: float = 3600.0) -> None:
        self._redis = client
        self._ttl_s = ttl_s
        self._claim_s = max(1, int(claim_s))
        self._claim = client.register_script(CLAIM_SCRIPT)

    def stored(self, action_id: str) -> dict[str, Any] | None:
        """The result already stored for ``action_id``, if any."""
        raw = self._redis.get(keys.action_result(action_id))
        return None if raw is None else dict(json.loads(raw))

    def begin(self, action_id: str, token: str) -> Start:
        """Claim ``action_id`` for the delivery ``token`` (see the module), on a replica before
        it returns when Redis has one; or the stored result, or the other delivery's token."""
        args = [keys.action_result(action_id), keys.action_attempts(action_id),
                keys.action_claim(action_id)]
        [(status, value)] = durable(self._redis, "claim", lambda pipe: self._claim(
            keys=args, args=[token, self._ttl_s, self._claim_s], client=pipe))
        status = status.decode() if isinstance(status, bytes) else str(status)
        if status == "stored":
            return Start(stored=dict(json.loads(value)))
        if status == "held":
            return Start(holder=value.decode() if isinstance(value, bytes) else str(value))
        return Start(attempt=int(value))

    def store(self, action_id: str, result: dict[str, Any]) -> dict[str, Any]:
        """Store ``result`` unless one is already stored; returns the one that is stored.

        A broker that is restarting is waited for (up to ``STORE_RETRY_S``), so a finished
        action's result is not lost to a short outage between its run and its ack.
        """
        deadline = time.monotonic() + STORE_RETRY_S
        delay = 0.05
        while True:
            try:
                return self._store_once(action_id, result)
            except (redis.ConnectionError, redis.TimeoutError):
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def results(self, action_ids: list[str]) -> list[dict[str, Any] | None]:
        """The stored results of several actions (None where there is none)."""
        raws = self._redis.mget([keys.action_result(a) for a in action_ids]) if action_ids else []
        return [None if raw is None else dict(json.loads(raw)) for raw in raws]

    def _store_once(self, action_id: str, result: dict[str, Any]) -> dict[str, Any]:
        body = json.dumps(result, separators=(",", ":"))
        key = keys.action_result(action_id)
        [done, raw] = durable(self._redis, "result", lambda pipe: (
            pipe.set(key, body, nx=True, ex=self._ttl_s), pipe.get(key)))
        if done or raw in (body, body.encode()):
            return result
        self._redis.incr(keys.DUPLICATE_RESULTS)
        return dict(json.loads(raw)) if raw is not None else result

    def dead_letter(self, reason: str, body: bytes | str | None, meta: dict[str, Any]) -> None:
        """Keep an undecodable or unroutable message with its reason (bounded list)."""
        raw = body.encode() if isinstance(body, str) else (body or b"")
        record = {
            "at": time.time(),
            "reason": reason[:2000],
            "body_b64": base64.b64encode(raw[:DEAD_LETTER_BODY_CAP]).decode(),
            "body_truncated": len(raw) > DEAD_LETTER_BODY_CAP,
            **{k: str(v)[:500] for k, v in meta.items()},
        }
        pipe = self._redis.pipeline()
        pipe.lpush(keys.DEAD_LETTERS, json.dumps(record))
        pipe.ltrim(keys.DEAD_LETTERS, 0, DEAD_LETTER_MAX - 1)
        pipe.execute()

    def dead_letters(self, count: int = 100) -> list[dict[str, Any]]:
        """The newest dead letters, newest first."""
        return [json.loads(r) for r in self._redis.lrange(keys.DEAD_LETTERS, 0, count - 1)]
