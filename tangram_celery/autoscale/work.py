"""Predicted work of queued actions: the tally, one action's, and raw kombu messages'.

Pure: the controller reads the messages of a pool's queues (ready and unacked) and sums what
they are expected to cost; the in-worker autoscaler does the same for its reserved requests.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tangram_celery.action import parse_action
from tangram_celery.errors import ValidationError


@dataclass(frozen=True)
class Work:
    """Predicted work of some messages: unit-seconds of those with an estimate, and how many
    have none."""

    seconds: float = 0.0
    unknown: int = 0
    count: int = 0

    def __add__(self, other: Work) -> Work:
        return Work(self.seconds + other.seconds, self.unknown + other.unknown,
                    self.count + other.count)

    def scaled(self, fraction: float) -> Work:
        """The same work for a fraction of the messages (prefetched among unacked)."""
        return Work(self.seconds * fraction, round(self.unknown * fraction),
                    round(self.count * fraction))


def message_body(raw: bytes | str) -> Any:
    """The action JSON inside one kombu Redis message (None when it is not one)."""
    try:
        envelope = json.loads(raw)
        body = envelope["body"]
        if envelope.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return args[0] if args else None
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None


def action_work(body: Any) -> Work:
    """Expected unit-seconds of one action at its minimum units (unknown without T1)."""
    try:
        action = parse_action(body)
    except ValidationError:
        return Work(0.0, 1, 1)
    units = action.units().allowed_units()[0] if action.units().allowed_units() else 1
    duration = action.expected_duration(units)
    return Work(0.0, 1, 1) if duration is None else Work(duration * max(units, 1), 0, 1)


def messages_work(raws: Iterable[bytes | str]) -> Work:
    """Total predicted work of raw kombu messages."""
    total = Work()
    for raw in raws:
        total += action_work(message_body(raw))
    return total


def unacked_work(values: Iterable[bytes | str], queues: set[str]) -> Work:
    """Predicted work of the unacked messages (``[message, exchange, routing_key]``) whose routing
    key is one of ``queues``."""
    picked: list[str] = []
    for value in values:
        try:
            message, _, routing_key = json.loads(value)
        except (ValueError, TypeError):
            continue
        if routing_key in queues:
            picked.append(json.dumps(message))
    return messages_work(picked)
