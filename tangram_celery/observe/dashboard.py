"""What ``tangram dashboard`` shows, as plain data: the recent ACT records of the ACT log
(:mod:`tangram_celery.tasks.actlog`) and one inventory snapshot
(:mod:`tangram_celery.pools.inventory`), the same sources as ``tangram exporter`` and
``tangram status``.

:func:`dashboard_view` is pure (records, inventory, clock in; a JSON-ready mapping out);
:func:`gather` does the Redis reads. The view holds:

* ``act``: per action kind and pool, the count, errors and mean queue / exec / overhead / total
  seconds of the actions finished in the window;
* ``timeline``: the same parts per time bucket (all kinds together), oldest first;
* ``queues``: ready and unacked messages per queue;
* ``pools``: units in use per pool against its size, and live members;
* ``residents``: reward models resident on each GPU pool, with their GPUs;
* ``isolation``: how each CPU node's sandbox holds its limits (flagged where it does not);
* ``slowest``: the recent actions with the largest ACT.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from tangram_celery import keys
from tangram_celery.pools.inventory import Inventory, read_inventory
from tangram_celery.settings import Settings
from tangram_celery.tasks.actlog import ActRecord

PARTS = ("queue_s", "exec_s", "overhead_s", "total_s")
SCAN_LIMIT = 20_000


@dataclass(frozen=True)
class ViewConfig:
    """How far back the page looks and how much it lists."""

    window_s: float = 600.0
    buckets: int = 20
    slowest: int = 10


def part_means(records: Sequence[ActRecord]) -> dict[str, float]:
    """Mean of each ACT part (``queue_s``, ``exec_s``, ``overhead_s``, ``total_s``)."""
    if not records:
        return dict.fromkeys(PARTS, 0.0)
    return {part: sum(getattr(r, part) for r in records) / len(records) for part in PARTS}


def act_rows(records: Iterable[ActRecord]) -> list[dict[str, Any]]:
    """One row per (kind, pool): count, errors and mean parts, the most actions first."""
    groups: dict[tuple[str, str], list[ActRecord]] = {}
    for record in records:
        groups.setdefault((record.kind, record.pool), []).append(record)
    rows = [{"kind": kind, "pool": pool, "count": len(group),
             "errors": sum(r.status != "ok" for r in group), **part_means(group)}
            for (kind, pool), group in groups.items()]
    return sorted(rows, key=lambda row: (-row["count"], row["kind"], row["pool"]))


def timeline(records: Iterable[ActRecord], now: float, config: ViewConfig
             ) -> list[dict[str, Any]]:
    """Mean ACT parts per bucket of ``window_s / buckets`` seconds, oldest first."""
    width = config.window_s / config.buckets
    start = now - config.window_s
    slots: list[list[ActRecord]] = [[] for _ in range(config.buckets)]
    for record in records:
        index = math.floor((record.at - start) / width)
        if 0 <= index < config.buckets:
            slots[index].append(record)
    return [{"start": start + i * width, "count": len(slot), **part_means(slot)}
            for i, slot in enumerate(slots)]


def slowest(records: Iterable[ActRecord], count: int) -> list[dict[str, Any]]:
    """The ``count`` records with the largest ACT, largest first."""
    ranked = sorted(records, key=lambda r: r.total_s, reverse=True)[:count]
    return [{"action_id": r.action_id, "kind": r.kind, "pool": r.pool, "node": r.node,
             "status": r.status, "at": r.at, **{p: getattr(r, p) for p in PARTS}}
            for r in ranked]


def inventory_view(inventory: Inventory) -> dict[str, Any]:
    """Queues, pools (units in use against their size) and resident models of a snapshot."""
    return {
        "queues": [{"queue": q.queue, "pool": q.pool, "ready": q.ready, "unacked": q.unacked}
                   for q in inventory.queues],
        "pools": [{"pool": p.pool, "resource": p.resource, "units": p.units,
                   "in_use": p.allocated, "members_alive": p.members_alive,
                   "members": p.members} for p in inventory.pools()],
        "residents": [{"pool": f"gpu/{g.name}", "model": r.model, "gpus": list(r.gpus)}
                      for g in inventory.gpu_pools for r in g.residents],
        "gpu_pools": len(inventory.gpu_pools),
        "isolation": [{"node": n.name, "isolation": n.isolation or "not reported",
                       "enforced": n.isolation.startswith("enforced")}
                      for n in inventory.nodes],
    }


def dashboard_view(records: Sequence[ActRecord], inventory: Inventory | None, now: float,
                   config: ViewConfig = ViewConfig()) -> dict[str, Any]:
    """Everything the page draws (``inventory`` None: Redis did not answer its reads)."""
    recent = [r for r in records if now - config.window_s <= r.at <= now + config.window_s]
    view: dict[str, Any] = {
        "at": now, "window_s": config.window_s, "actions": len(recent),
        "act": act_rows(recent), "timeline": timeline(recent, now, config),
        "slowest": slowest(recent, config.slowest), "redis_up": inventory is not None,
    }
    empty = {"queues": [], "pools": [], "residents": [], "gpu_pools": 0, "isolation": []}
    return {**view, **(inventory_view(inventory) if inventory is not None else empty)}


def recent_records(client: redis.Redis, since: float, limit: int = SCAN_LIMIT
                   ) -> list[ActRecord]:
    """ACT records appended to the stream since ``since`` (by the stream's own clock), newest
    ``limit`` at most."""
    entries: Any = client.xrevrange(keys.METRICS_ACTS, min=f"{max(int(since * 1000), 0)}",
                                    count=limit)
    return [r for _, raw in entries or () if raw and (r := ActRecord.decode(raw)) is not None]


def gather(client: redis.Redis, settings: Settings, now: float,
           config: ViewConfig = ViewConfig()) -> dict[str, Any]:
    """Read the ACT stream and the inventory, then build :func:`dashboard_view`; a Redis that
    does not answer gives an empty view with ``redis_up`` false."""
    try:
        records = recent_records(client, now - config.window_s)
        inventory = read_inventory(client, settings, now)
    except (redis.RedisError, OSError):
        return dashboard_view([], None, now, config)
    return dashboard_view(records, inventory, now, config)
