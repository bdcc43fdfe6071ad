"""Exactly-once results over at-least-once delivery, and the dead-letter list.

Celery with late acks delivers an action again if its worker dies. The ledger makes the *result*
idempotent: the first result stored for an action id wins (``SET NX``), a redelivered action that
already has one gets it back without running again, and one that never finished runs again with
``attempts`` saying how many times it was started. Messages that cannot be decoded at all go to a
dead-letter list with their reason instead of vanishing.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import redis

from tangram_celery import keys

DEAD_LETTER_BODY_CAP = 65536
DEAD_LETTER_MAX = 10000
STORE_RETRY_S = 60.0


class Ledger:
    """Stored results and start counts of actions, in Redis."""

    def __init__(self, client: redis.Redis, ttl_s: int) -> None:
        self._redis = client
        self._ttl_s = ttl_s

    def stored(self, action_id: str) -> dict[str, Any] | None:
        """The result already stored for ``action_id``, if any."""
        raw = self._redis.get(keys.action_result(action_id))
        return None if raw is None else dict(json.loads(raw))

    def begin(self, action_id: str) -> int:
        """Count one more start of ``action_id``; returns the attempt number (1 = first)."""
        pipe = self._redis.pipeline()
        pipe.incr(keys.action_attempts(action_id))
        pipe.expire(keys.action_attempts(action_id), self._ttl_s)
        attempt, _ = pipe.execute()
        return int(attempt)

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
        if self._redis.set(keys.action_result(action_id), body, nx=True, ex=self._ttl_s):
            return result
        self._redis.incr(keys.DUPLICATE_RESULTS)
        winner = self.stored(action_id)
        return winner if winner is not None else result

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
