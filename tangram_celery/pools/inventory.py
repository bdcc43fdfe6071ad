"""What is in Redis right now: pools, their members and units, and every queue's depth.

Shared by ``tangram status`` and ``tangram exporter``. One I/O function, :func:`read_inventory`,
gathers plain data; everything else here is pure.

Queue depth counts every Celery priority sub-list (kombu names them ``<queue><sep><step>``, the
base list holding step 0), which Flower and KEDA's list length miss; ``unacked`` counts the
messages a worker holds without having acked them (prefetched in its admission window, or
running), from kombu's ``unacked`` hash, whose values are ``[message, exchange, routing_key]``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from tangram_celery import keys
from tangram_celery.keys import DEFAULT_GPU_POOL
from tangram_celery.managers.basic import ApiSpec, parse_api_limits
from tangram_celery.pools.registry import NodeView, Registry
from tangram_celery.settings import Settings
from tangram_celery.tasks.actlog import pool_of_queue
from tangram_celery.tasks.app import celery_config
from tangram_celery.tasks.clock import broker_time

UNACKED_KEY = "unacked"
UNACKED_TAIL_CHARS = 600
_ROUTING_KEY_TAIL = re.compile(r',\s*("(?:[^"\\]|\\.)*")\s*\]\s*$')
UNACKED_TAILS_SCRIPT = """
local out = {}
for i, v in ipairs(redis.call('HVALS', KEYS[1])) do out[i] = string.sub(v, -ARGV[1]) end
return out
"""


@dataclass(frozen=True)
class QueueDepth:
    """One queue: ready messages per priority step, and messages held unacked by workers."""

    queue: str
    pool: str
    by_priority: tuple[tuple[int, int], ...]
    unacked: int = 0

    @property
    def ready(self) -> int:
        """Messages waiting in Redis, over every priority sub-list."""
        return sum(count for _, count in self.by_priority)


@dataclass(frozen=True)
class Resident:
    """A reward model resident on some GPUs of a GPU pool."""

    model: str
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class GpuPoolView:
    """What a GPU pool publishes about itself (``keys.gpu_pool``)."""

    name: str
    gpus: int
    free_gpus: int
    alive: bool
    worker: str = ""
    models: tuple[str, ...] = ()
    residents: tuple[Resident, ...] = ()


@dataclass(frozen=True)
class ApiPoolView:
    """A declared API: its concurrency cap, slots leased now, and actions waiting for it."""

    name: str
    concurrency: int | None
    in_use: int
    waiting: int
    quota: str = ""


@dataclass(frozen=True)
class AutoscaleView:
    """What the autoscaler last published for one pool (``keys.autoscale_pool``)."""

    pool: str
    target: int
    actual: int
    action: str = ""
    reason: str = ""
    at: float = 0.0


@dataclass(frozen=True)
class PoolSummary:
    """One pool's totals: members alive, units, units allocated now, queued messages."""

    pool: str
    resource: str
    members_alive: int
    members: int
    units: int | None
    allocated: int
    ready: int
    unacked: int

    @property
    def free(self) -> int | None:
        """Units not allocated (None when the pool has no fixed size)."""
        return None if self.units is None else max(self.units - self.allocated, 0)


@dataclass(frozen=True)
class MemoryLine:
    """The CPU pool's trajectories waiting for memory: live tickets of the shared line."""

    waiting: int = 0
    memory_mb: float = 0.0
    """What they ask for in all."""
    oldest_wait_s: float = 0.0


def memory_line(infos: Mapping[bytes | str, bytes | str],
                leases: Iterable[tuple[bytes | str, float]], now: float) -> MemoryLine:
    """The line from its ticket info hash and lease scores (tickets whose lease ran out belong
    to dead clients and are left out; malformed info counts no memory)."""
    live = {_text(t) for t, until in leases if until > now}
    asked, since = 0.0, now
    for trajectory, raw in infos.items():
        if _text(trajectory) not in live:
            continue
        try:
            info = json.loads(raw)
            asked += float(info.get("memory_mb", 0.0))
            since = min(since, float(info.get("since", now)))
        except (ValueError, TypeError, AttributeError):
            continue
    return MemoryLine(len(live), asked, max(now - since, 0.0))


@dataclass(frozen=True)
class Inventory:
    """Everything ``tangram status`` and the exporter show, gathered at ``at``."""

    at: float
    nodes: tuple[NodeView, ...]
    gpu_pools: tuple[GpuPoolView, ...]
    api_pools: tuple[ApiPoolView, ...]
    queues: tuple[QueueDepth, ...]
    autoscale: tuple[AutoscaleView, ...] = ()
    memory_line: MemoryLine = MemoryLine()

    def queue(self, name: str) -> QueueDepth | None:
        """The depth of queue ``name``, if it was read."""
        return next((q for q in self.queues if q.queue == name), None)

    def pools(self) -> list[PoolSummary]:
        """Per-pool totals: ``cpu`` over every CPU node, one per GPU pool and per API."""
        by_pool: dict[str, list[QueueDepth]] = {}
        for depth in self.queues:
            by_pool.setdefault(depth.pool, []).append(depth)

        def summary(pool: str, resource: str, alive: int, members: int, units: int | None,
                    allocated: int) -> PoolSummary:
            queues = by_pool.get(pool, [])
            return PoolSummary(pool, resource, alive, members, units, allocated,
                               sum(q.ready for q in queues), sum(q.unacked for q in queues))

        live = [n for n in self.nodes if n.alive]
        rows = [summary("cpu", "cpu", len(live), len(self.nodes), sum(n.cores for n in live),
                        sum(max(n.cores - n.free_cores, 0) for n in live))]
        for gpu in self.gpu_pools:
            rows.append(summary(f"gpu/{gpu.name}", "gpu", int(gpu.alive), 1,
                                gpu.gpus if gpu.alive else 0,
                                max(gpu.gpus - gpu.free_gpus, 0) if gpu.alive else 0))
        known = {r.pool for r in rows}
        for api in self.api_pools:
            rows.append(summary(f"api/{api.name}", "slots", 0, 0, api.concurrency, api.in_use))
            known.add(f"api/{api.name}")
        for pool in sorted(set(by_pool) - known - {"control", "other"}):
            rows.append(summary(pool, "gpu" if pool.startswith("gpu/") else "slots", 0, 0,
                                None, 0))
        return rows


def priority_lists(queue: str, sep: str, steps: Sequence[int]) -> list[tuple[int, str]]:
    """The Redis lists of ``queue``, one per priority step, as kombu names them."""
    return [(step, f"{queue}{sep}{step}" if step else queue) for step in steps]


def routing_key_of_unacked(tail: bytes | str) -> str | None:
    """The routing key (queue) at the end of a kombu ``unacked`` value, or None."""
    text = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
    match = _ROUTING_KEY_TAIL.search(text)
    if match is None:
        return None
    try:
        value = json.loads(match.group(1))
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def unacked_by_queue(tails: Iterable[bytes | str]) -> Counter[str]:
    """Unacked messages per queue, from the tails of the ``unacked`` hash's values."""
    return Counter(q for q in map(routing_key_of_unacked, tails) if q)


def known_queues(
    nodes: Iterable[NodeView],
    gpu_pools: Iterable[GpuPoolView],
    apis: Iterable[str],
    seen: Iterable[str] = (),
    extra: Iterable[str] = (),
) -> list[str]:
    """Every queue to measure: each CPU node's, each published GPU pool's (and the default
    one), each declared API's, the control queue, queues seen holding unacked messages, and
    ``extra``."""
    names = {keys.cpu_queue(n.name) for n in nodes}
    names |= {keys.gpu_queue(p.name) for p in gpu_pools} | {keys.gpu_queue(DEFAULT_GPU_POOL)}
    names |= {keys.api_queue(a) for a in apis}
    names |= {keys.control_queue(), *seen, *extra}
    return sorted(names)


def gpu_pool_view(name: str, raw: Mapping[bytes | str, bytes | str], now: float,
                  ttl_s: float) -> GpuPoolView:
    """Decode a GPU pool's published hash (malformed optional fields are left empty)."""
    fields = {_text(k): _text(v) for k, v in raw.items()}
    residents = tuple(
        Resident(str(r["model"]), tuple(int(g) for g in r.get("gpus", ())))
        for r in _json_list(fields.get("residents"))
        if isinstance(r, Mapping) and "model" in r
    )
    return GpuPoolView(
        name=name,
        gpus=_int(fields.get("gpus")),
        free_gpus=_int(fields.get("free_gpus")),
        alive=now - _float(fields.get("heartbeat")) <= ttl_s,
        worker=fields.get("worker", ""),
        models=tuple(str(m) for m in _json_list(fields.get("models"))),
        residents=residents,
    )


def api_pool_view(spec: ApiSpec, in_use: int, waiting: int) -> ApiPoolView:
    """A declared API with its current use."""
    quota = "" if spec.quota is None else f"{spec.quota.count}/{spec.quota.period_s:g}s"
    return ApiPoolView(spec.name, spec.concurrency, in_use, waiting, quota)


def read_inventory(
    client: redis.Redis, settings: Settings, now: float | None = None,
    extra_queues: Iterable[str] = (),
) -> Inventory:
    """Read nodes, GPU pools, API use and queue depths from Redis (raises ``RedisError``)."""
    now = broker_time(client) if now is None else now
    registry = Registry(client, settings.node.ttl_s, settings.actions.trajectory_ttl_s)
    nodes = tuple(registry.nodes(now))
    gpu_pools = _read_gpu_pools(client, now, settings.node.ttl_s)
    specs = parse_api_limits(settings.api.limits)
    api_pools = _read_api_pools(client, specs, now)
    unacked = unacked_by_queue(
        client.eval(UNACKED_TAILS_SCRIPT, 1, UNACKED_KEY, UNACKED_TAIL_CHARS)
    )
    names = known_queues(nodes, gpu_pools, specs, unacked, extra_queues)
    options = celery_config(settings)["broker_transport_options"]
    queues = _read_depths(client, names, str(options["sep"]), list(options["priority_steps"]),
                          unacked)
    return Inventory(now, nodes, gpu_pools, api_pools, queues, _read_autoscale(client),
                     _read_memory_line(client, now))


def _read_memory_line(client: redis.Redis, now: float) -> MemoryLine:
    pipe = client.pipeline()
    pipe.hgetall(keys.MEMORY_TICKET_INFO)
    pipe.zrange(keys.MEMORY_TICKET_LEASES, 0, -1, withscores=True)
    infos, leases = pipe.execute()
    return memory_line(infos, leases, now)


def autoscale_view(pool: str, raw: Mapping[bytes | str, bytes | str]) -> AutoscaleView:
    """Decode the autoscaler's published hash of one pool (malformed fields read as empty)."""
    fields = {_text(k): _text(v) for k, v in raw.items()}
    return AutoscaleView(pool, _int(fields.get("target")), _int(fields.get("actual")),
                         fields.get("action", ""), fields.get("reason", ""),
                         _float(fields.get("at")))


def _read_autoscale(client: redis.Redis) -> tuple[AutoscaleView, ...]:
    names = sorted(_text(n) for n in client.smembers(keys.AUTOSCALE_POOLS))
    pipe = client.pipeline()
    for name in names:
        pipe.hgetall(keys.autoscale_pool(name))
    return tuple(autoscale_view(name, raw)
                 for name, raw in zip(names, pipe.execute(), strict=True) if raw)


def _read_gpu_pools(client: redis.Redis, now: float, ttl_s: float) -> tuple[GpuPoolView, ...]:
    names = sorted(_text(n) for n in client.smembers(keys.GPU_POOLS))
    pipe = client.pipeline()
    for name in names:
        pipe.hgetall(keys.gpu_pool(name))
    return tuple(gpu_pool_view(name, raw, now, ttl_s)
                 for name, raw in zip(names, pipe.execute(), strict=True) if raw)


def _read_api_pools(
    client: redis.Redis, specs: Mapping[str, ApiSpec], now: float
) -> tuple[ApiPoolView, ...]:
    names = sorted(specs)
    pipe = client.pipeline()
    for name in names:
        pipe.zcount(keys.api_leases(name), now, "+inf")
        pipe.zcard(keys.api_tickets(name))
    counts = pipe.execute()
    return tuple(api_pool_view(specs[name], int(counts[2 * i]), int(counts[2 * i + 1]))
                 for i, name in enumerate(names))


def _read_depths(
    client: redis.Redis, names: Sequence[str], sep: str, steps: Sequence[int],
    unacked: Mapping[str, int],
) -> tuple[QueueDepth, ...]:
    pipe = client.pipeline()
    for name in names:
        for _, key in priority_lists(name, sep, steps):
            pipe.llen(key)
    lengths = iter(pipe.execute())
    return tuple(
        QueueDepth(name, pool_of_queue(name), tuple((step, int(next(lengths))) for step in steps),
                   unacked.get(name, 0))
        for name in names
    )


def _text(raw: bytes | str) -> str:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else raw


def _int(raw: str | None) -> int:
    try:
        return int(float(raw)) if raw else 0
    except ValueError:
        return 0


def _float(raw: str | None) -> float:
    try:
        return float(raw) if raw else 0.0
    except ValueError:
        return 0.0


def _json_list(raw: str | None) -> list[Any]:
    try:
        value = json.loads(raw) if raw else []
    except ValueError:
        return []
    return value if isinstance(value, list) else []
