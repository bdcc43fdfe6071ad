"""Durations learned cluster-wide: every worker's finished actions, shared through one stream.

A worker (a CPU node, a GPU pool) learns each signature's durations from the actions it
finishes (:func:`tangram_celery.scheduling.learned.learn`). Alone, it sees a signature rarely: a
GRPO group's rollouts are spread over the nodes, so the node that runs one has seldom run
another, and a teacher's calls are spread over the GPU pools. `SharedDurations` publishes every
observation to one Redis stream per pool type (``keys.duration_log``: CPU nodes share one, GPU
pools another), trimmed to `keep` entries; the worker's sync thread (every `every_s` seconds,
off the actions' path) folds the other workers' new entries into its model, and a worker that
starts reads the stream's history first. Entries
are plain strings, parsed and checked; one that does not parse is skipped. Learning never fails
an action: a Redis error is logged and the node goes on with what it knows.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping
from typing import Any

import redis

from tangram_celery import keys
from tangram_celery.scheduling import DurationModel
from tangram_celery.scheduling.estimator import Signature
from tangram_celery.scheduling.learned import learn

log = logging.getLogger(__name__)

Entry = tuple[str, Signature, int, float]
"""(node, signature, units, seconds) of one finished action."""


class SharedDurations:
    """One worker's side of the shared duration log of its pool type ``pools`` (``keys.CPU``
    or ``keys.GPU``; see the module docstring)."""

    def __init__(self, client: redis.Redis, node: str, model: DurationModel,
                 every_s: float = 1.0, keep: int = 20_000, pools: str = keys.CPU) -> None:
        self.client, self.node, self.model = client, node, model
        self.every_s, self.keep = every_s, keep
        self.key = keys.duration_log(pools)
        self._last = "0-0"
        self.lock = threading.Lock()
        """Held while the model learns; hold it to read the model from another thread."""

    def learn(self, signature: Signature, units: int, seconds: float) -> None:
        """Learn a finished action locally and publish it for the other nodes."""
        with self.lock:
            learn(self.model, signature, units, seconds)
        fields: dict[Any, Any] = {"node": self.node, "kind": signature[0], "key": signature[1],
                  "units": str(units), "seconds": repr(float(seconds))}
        try:
            self.client.xadd(self.key, fields, maxlen=self.keep, approximate=True)
        except redis.RedisError as exc:
            log.warning("durations: could not publish to %s: %s", self.key, exc)

    def catch_up(self) -> int:
        """Fold the other nodes' entries published since the last call into the model;
        returns how many were learned."""
        learned = 0
        try:
            full = True
            while full:
                batch, full = self._read()
                for node, signature, units, seconds in batch:
                    if node != self.node:
                        with self.lock:
                            learn(self.model, signature, units, seconds)
                        learned += 1
            return learned
        except redis.RedisError as exc:
            log.warning("durations: could not read %s: %s", self.key, exc)
            return learned

    def _read(self) -> tuple[list[Entry], bool]:
        """The next entries after the last one read, and whether the batch was full (more
        may be behind it)."""
        answer: Any = self.client.xread({self.key: self._last}, count=_BATCH)
        if not answer:
            return [], False
        entries = []
        _, rows = answer[0]
        for entry_id, fields in rows:
            self._last = _text(entry_id)
            parsed = parse_entry(fields)
            if parsed is None:
                log.warning("durations: skipped a malformed entry %s of %s", self._last,
                            self.key)
            else:
                entries.append(parsed)
        return entries, len(rows) == _BATCH


_BATCH = 1000


def parse_entry(fields: Mapping[bytes | str, bytes | str]) -> Entry | None:
    """One stream entry as (node, signature, units, seconds), or None if any part is missing
    or out of range (units >= 1, seconds positive and finite)."""
    values = {_text(k): _text(v) for k, v in fields.items()}
    try:
        node, kind, key = values["node"], values["kind"], values["key"]
        units, seconds = int(values["units"]), float(values["seconds"])
    except (KeyError, ValueError):
        return None
    if units < 1 or not seconds > 0 or not math.isfinite(seconds) or not kind:
        return None
    return node, (kind, key), units, seconds


def _text(raw: bytes | str) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
