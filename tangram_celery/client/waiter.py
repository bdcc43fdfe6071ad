"""Waiting for results without polling: one thread per client owns a Redis pub/sub connection.

Celery's Redis backend publishes every stored task state on a channel named after the result key.
The waiter subscribes to the keys of pending actions, checks each key once after subscribing (so
nothing stored in between is missed), and resolves a :class:`concurrent.futures.Future` per
action. Sync callers block on the future; asyncio callers await ``asyncio.wrap_future`` of it, so
one piece serves both and no Celery result consumer is shared across threads.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import redis

log = logging.getLogger(__name__)

READY_STATES = frozenset({"SUCCESS", "FAILURE", "REVOKED"})
SWEEP_INTERVAL_S = 1.0


def decode_meta(raw: bytes | str | None) -> dict[str, Any] | None:
    """A Celery result record if it is in a ready state, else None."""
    if raw is None:
        return None
    try:
        meta = json.loads(raw)
    except ValueError:
        return None
    if isinstance(meta, dict) and meta.get("status") in READY_STATES:
        return meta
    return None


class ResultWaiter:
    """Resolve futures when Celery stores the results of given result keys."""

    def __init__(
        self, client: redis.Redis,
        fallback: Callable[[list[bytes]], list[dict[str, Any] | None]] | None = None,
        on_sweep: Callable[[], None] | None = None,
    ) -> None:
        """``fallback`` maps result keys to ready records found elsewhere (the action ledger),
        consulted by the periodic sweep in case Celery's own record was lost; ``on_sweep`` is
        called after every sweep, on the waiter thread (the client's lost-action audit)."""
        self._client = client
        self._fallback = fallback
        self._on_sweep = on_sweep
        self._lock = threading.Lock()
        self._pending: dict[bytes, Future[dict[str, Any]]] = {}
        self._new: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def wait_for(self, key: bytes) -> Future[dict[str, Any]]:
        """A future of the ready Celery record stored under ``key``."""
        meta = decode_meta(self._client.get(key))
        if meta is not None:
            done: Future[dict[str, Any]] = Future()
            done.set_result(meta)
            return done
        with self._lock:
            future = self._pending.get(key)
            if future is None:
                future = Future()
                self._pending[key] = future
                self._new.put(key)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="tangram-waiter",
                                                daemon=True)
                self._thread.start()
        return future

    def forget(self, key: bytes) -> None:
        """Stop waiting for ``key`` (its future is left as it is)."""
        with self._lock:
            self._pending.pop(key, None)

    def close(self) -> None:
        """Stop the thread; pending futures stay unresolved."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._serve()
            except Exception:  # the waiter must outlive any broker or client failure
                log.warning("result waiter lost Redis; reconnecting", exc_info=True)
                self._stop.wait(0.2)

    def _serve(self) -> None:
        client = self._client
        open_pubsub: Callable[..., Any] = client.pubsub
        pubsub = open_pubsub(ignore_subscribe_messages=True)
        with self._lock:
            for key in self._pending:
                self._new.put(key)
        last_sweep = time.monotonic()
        try:
            while not self._stop.is_set():
                self._subscribe_new(client, pubsub)
                if pubsub.subscribed:
                    message = pubsub.get_message(timeout=0.002)
                    if message is not None and message.get("type") == "message":
                        self._resolve(pubsub, message["channel"], message["data"])
                else:
                    self._idle(client, pubsub)
                if time.monotonic() - last_sweep > SWEEP_INTERVAL_S:
                    self._sweep(client, pubsub)
                    last_sweep = time.monotonic()
        finally:
            pubsub.close()

    def _idle(self, client: redis.Redis, pubsub: Any) -> None:
        try:
            key = self._new.get(timeout=0.1)
        except queue.Empty:
            return
        self._new.put(key)
        self._subscribe_new(client, pubsub)

    def _subscribe_new(self, client: redis.Redis, pubsub: Any) -> None:
        batch: list[bytes] = []
        while not self._new.empty() and len(batch) < 512:
            batch.append(self._new.get())
        if not batch:
            return
        pubsub.subscribe(*batch)
        for key, raw in zip(batch, client.mget(batch), strict=True):
            self._resolve(pubsub, key, raw)

    def _sweep(self, client: redis.Redis, pubsub: Any) -> None:
        """Look every pending key up directly (results published while the subscription was
        down are not missed) and subscribe again any key the subscription lost."""
        with self._lock:
            pending = list(self._pending)
        subscribed = set(pubsub.channels)
        for key in pending:
            if key not in subscribed:
                self._new.put(key)
        for start in range(0, len(pending), 512):
            chunk = pending[start : start + 512]
            for key, raw in zip(chunk, client.mget(chunk), strict=True):
                self._resolve(pubsub, key, raw)
        self._sweep_fallback(pubsub)
        if self._on_sweep is not None:
            self._on_sweep()

    def _sweep_fallback(self, pubsub: Any) -> None:
        if self._fallback is None:
            return
        with self._lock:
            pending = list(self._pending)
        if not pending:
            return
        for key, meta in zip(pending, self._fallback(pending), strict=True):
            if meta is not None:
                self._resolve(pubsub, key, json.dumps(meta))

    def _resolve(self, pubsub: Any, key: bytes, raw: bytes | str | None) -> None:
        meta = decode_meta(raw)
        if meta is None:
            return
        with self._lock:
            future = self._pending.pop(key, None)
        if pubsub.subscribed:
            pubsub.unsubscribe(key)
        if future is not None and not future.done():
            future.set_result(meta)
