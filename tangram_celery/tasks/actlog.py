"""The ACT log: the worker's view of each result, and one compact record per executed action.

Workers (in :func:`tangram_celery.tasks.app.execute_once`) fill in the timestamps a result lacks on
the worker side (the client stamps ``submitted``/``published`` only when it fetches the result), so
the ``act`` stored in the result backend and shown in Flower is meaningful; then they append a
compact record to a capped Redis stream (``keys.METRICS_ACTS``) that ``tangram exporter`` reads.
Everything here but :func:`append` is pure.

The worker's view ends when the result is stored: its ``overhead`` leaves out the client's
result fetch, and its ``queue`` starts at the client's ``submitted_at`` stamp (validation,
routing and publish included). The client's own :attr:`ActionResult.act` stays exact.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis

from tangram_celery import keys
from tangram_celery.action import ActionResult

ACTS_MAXLEN = 100_000
SUMMARY_FIRST = (
    "action_id", "trajectory_id", "kind", "status", "act", "node", "units", "error", "attempts",
)
RECORD_FIELDS = ("kind", "pool", "queue", "node", "status", "queue_s", "exec_s", "overhead_s",
                 "total_s", "at", "action_id")


def pool_of_queue(queue: str) -> str:
    """The pool a queue feeds: ``cpu`` (every CPU node), ``gpu/<pool>``, ``api/<api>``,
    ``control`` or ``other``."""
    for prefix, pool in ((keys.cpu_queue(""), "cpu"), (keys.gpu_queue(""), "gpu/"),
                         (keys.api_queue(""), "api/")):
        if queue.startswith(prefix) and len(queue) > len(prefix):
            return pool if pool == "cpu" else pool + queue[len(prefix):]
    return "control" if queue == keys.control_queue() else "other"


def worker_view(result: Mapping[str, Any], message: Any) -> dict[str, Any]:
    """``result`` with the submit stamps taken from the message and ``act`` recomputed.

    ``submitted`` and ``published`` come from the message's ``submitted_at`` (else the receive
    time) when the result has none. Keys are ordered summary first (ids, kind, status, ``act``,
    node, units, error), bulky ``timings`` and ``output`` last, so Flower's bounded repr of a
    result keeps its ACT. A result that is not an ActionResult's JSON is returned unchanged.
    """
    try:
        parsed = ActionResult.from_json(result)
    except (KeyError, TypeError, ValueError):
        return dict(result)
    timings = parsed.timings
    if not timings.submitted:
        sent = message.get("submitted_at") if isinstance(message, Mapping) else None
        stamp = float(sent) if isinstance(sent, int | float) and sent > 0 else timings.received
        timings.submitted = timings.published = stamp
    merged = {**result, "timings": vars(timings).copy(), "act": parsed.act}
    return summary_first(merged)


def summary_first(result: Mapping[str, Any]) -> dict[str, Any]:
    """The same mapping with the :data:`SUMMARY_FIRST` keys first."""
    head = {k: result[k] for k in SUMMARY_FIRST if k in result}
    return {**head, **{k: v for k, v in result.items() if k not in head}}


def act_record(result: Mapping[str, Any], queue: str) -> dict[str, str]:
    """The compact stream record of one result (see :data:`RECORD_FIELDS`)."""
    act = result.get("act") if isinstance(result.get("act"), Mapping) else {}
    timings = result.get("timings") if isinstance(result.get("timings"), Mapping) else {}

    def seconds(part: str) -> str:
        value = act.get(part, 0.0) if isinstance(act, Mapping) else 0.0
        return f"{float(value):.6f}" if isinstance(value, int | float) else "0"

    stored = timings.get("stored", 0.0) if isinstance(timings, Mapping) else 0.0
    return {
        "kind": str(result.get("kind", ""))[:32],
        "pool": pool_of_queue(queue),
        "queue": queue[:200],
        "node": str(result.get("node", ""))[:128],
        "status": str(result.get("status", ""))[:32],
        "queue_s": seconds("queue"),
        "exec_s": seconds("exec"),
        "overhead_s": seconds("overhead"),
        "total_s": seconds("total"),
        "at": f"{float(stored):.6f}" if isinstance(stored, int | float) else "0",
        "action_id": str(result.get("action_id", ""))[:128],
    }


@dataclass(frozen=True)
class ActRecord:
    """One decoded stream record: where an action ran and its ACT parts in seconds."""

    kind: str
    pool: str
    queue: str
    node: str
    status: str
    queue_s: float
    exec_s: float
    overhead_s: float
    total_s: float
    at: float
    action_id: str = ""

    @classmethod
    def decode(cls, fields: Mapping[bytes | str, bytes | str]) -> ActRecord | None:
        """Decode a stream entry's fields; None when one is missing or malformed."""
        text = {_text(k): _text(v) for k, v in fields.items()}
        try:
            return cls(
                kind=text["kind"], pool=text["pool"], queue=text["queue"], node=text["node"],
                status=text["status"], queue_s=float(text["queue_s"]),
                exec_s=float(text["exec_s"]), overhead_s=float(text["overhead_s"]),
                total_s=float(text["total_s"]), at=float(text["at"]),
                action_id=text.get("action_id", ""),
            )
        except (KeyError, ValueError):
            return None


def append(client: redis.Redis, record: Mapping[str, str], maxlen: int = ACTS_MAXLEN) -> None:
    """Append one record to the capped ACT stream (trimmed approximately to ``maxlen``)."""
    fields: dict[Any, Any] = dict(record)
    client.xadd(keys.METRICS_ACTS, fields, maxlen=maxlen, approximate=True)


def _text(raw: bytes | str) -> str:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else raw
