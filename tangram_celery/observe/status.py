"""``tangram status``: pools, their workers, queue depths, units and resident models, as tables.

:func:`gather_status` does the I/O (Redis, and a Celery ``inspect`` of which workers consume
which queue); :func:`render_status` turns that plain data into ``rich`` tables.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from celery import Celery
from kombu.exceptions import OperationalError
from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from tangram_celery import keys
from tangram_celery.command_line import run_with_settings
from tangram_celery.connection import connect
from tangram_celery.errors import BrokerUnreachable
from tangram_celery.observe.gateways import GatewayView, gateways_table, read_gateways
from tangram_celery.pools.inventory import Inventory, QueueDepth, read_inventory
from tangram_celery.settings import Settings
from tangram_celery.tasks.app import make_app

DEFAULT_INSPECT_TIMEOUT_S = 1.0
PIPE_WIDTH = 140


@dataclass(frozen=True)
class StatusData:
    """Everything the status tables show."""

    inventory: Inventory
    consumers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    inspected: bool = False
    broker: str = ""
    gateways: tuple[GatewayView, ...] = ()


def consumers_by_queue(active_queues: Mapping[str, Iterable[Mapping[str, Any]]] | None
                       ) -> dict[str, tuple[str, ...]]:
    """Queue name -> the Celery workers consuming it, from ``inspect().active_queues()``."""
    found: dict[str, set[str]] = {}
    for worker, queues in (active_queues or {}).items():
        for queue in queues:
            name = queue.get("name")
            if isinstance(name, str):
                found.setdefault(name, set()).add(worker)
    return {queue: tuple(sorted(workers)) for queue, workers in found.items()}


def gather_status(
    settings: Settings, app: Celery | None = None,
    inspect_timeout_s: float = DEFAULT_INSPECT_TIMEOUT_S, extra_queues: Iterable[str] = (),
) -> StatusData:
    """Read the inventory and (unless ``inspect_timeout_s`` is 0) ask workers for their queues.

    Raises :class:`BrokerUnreachable` when Redis does not answer.
    """
    client = connect(settings.broker, retry_s=0)
    try:
        inventory = read_inventory(client, settings, extra_queues=extra_queues)
        gateways = read_gateways(client, time.time())
    except (redis.RedisError, OSError) as exc:
        raise BrokerUnreachable(settings.broker.redis_url, exc) from None
    finally:
        client.close()
    broker = BrokerUnreachable.where(settings.broker.redis_url)
    if inspect_timeout_s <= 0:
        return StatusData(inventory, broker=broker, gateways=gateways)
    app = app or make_app(settings)
    try:
        replies = app.control.inspect(timeout=inspect_timeout_s).active_queues()
    except OperationalError as exc:
        raise BrokerUnreachable(settings.broker.redis_url, exc) from None
    return StatusData(inventory, consumers_by_queue(replies), inspected=True, broker=broker,
                      gateways=gateways)


def render_status(data: StatusData) -> Group:
    """The pools table, the queues table, and notes on what is not known."""
    extra = [gateways_table(data.gateways)] if data.gateways else []
    return Group(_pools_table(data), _queues_table(data.inventory), *extra, *_notes(data))


def print_status(
    settings: Settings, console: Console | None = None,
    inspect_timeout_s: float = DEFAULT_INSPECT_TIMEOUT_S, extra_queues: Iterable[str] = (),
) -> StatusData:
    """``tangram status``: gather and print; returns what it printed."""
    data = gather_status(settings, inspect_timeout_s=inspect_timeout_s,
                         extra_queues=extra_queues)
    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=max(console.width, PIPE_WIDTH))
    console.print(render_status(data))
    return data


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``tangram status`` (also ``python -m tangram_celery.observe.status``)."""
    parser.add_argument("--inspect-timeout", type=float, default=DEFAULT_INSPECT_TIMEOUT_S,
                        help="seconds to wait for workers to say which queues they consume "
                             f"(default {DEFAULT_INSPECT_TIMEOUT_S}; 0 skips it)")
    parser.add_argument("--queue", action="append", default=[],
                        help="also measure this queue (repeatable); pools' queues are found")


def run_from_args(settings: Settings, args: argparse.Namespace) -> int:
    """Run ``tangram status`` with parsed :func:`add_arguments`."""
    print_status(settings, inspect_timeout_s=args.inspect_timeout, extra_queues=args.queue)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m tangram_celery.observe.status``."""
    parser = argparse.ArgumentParser(prog="tangram status", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run_with_settings(parser, run_from_args, argv)


def _pools_table(data: StatusData) -> Table:
    inventory = data.inventory
    stamp = time.strftime("%H:%M:%S", time.localtime(inventory.at))
    table = Table(title=f"tangram pools ({data.broker} at {stamp})", title_justify="left",
                  box=box.SIMPLE_HEAD)
    for column in ("pool", "member", "alive", "units", "alloc", "free", "ready", "unacked"):
        table.add_column(column, justify="right" if column not in {"pool", "member"} else "left",
                         no_wrap=True)
    table.add_column("workers, resident models, notes")
    for summary in inventory.pools():
        alive = f"{summary.members_alive}/{summary.members}" if summary.members else ""
        table.add_row(
            Text(summary.pool, style="bold"), "", alive, _num(summary.units),
            str(summary.allocated), _num(summary.free), str(summary.ready), str(summary.unacked),
            _workers(data, _pool_queues(inventory, summary.pool)),
        )
        for row in _member_rows(data, summary.pool):
            table.add_row("", *row)
    return table


def _member_rows(data: StatusData, pool: str) -> list[tuple[str, ...]]:
    inventory = data.inventory
    if pool == "cpu":
        return [(node.name, _yes(node.alive), str(node.cores),
                 str(max(node.cores - node.free_cores, 0)), str(node.free_cores),
                 *_depth(inventory.queue(keys.cpu_queue(node.name))),
                 f"memory reserved {node.reserved_mb:g}/{node.memory_mb:g} MB"
                 + (f"; isolation {node.isolation}" if node.isolation else ""))
                for node in inventory.nodes]
    for gpu in inventory.gpu_pools:
        if pool == f"gpu/{gpu.name}":
            resident = ", ".join(f"{r.model}@{list(r.gpus)}" for r in gpu.residents)
            return [(gpu.worker or gpu.name, _yes(gpu.alive), str(gpu.gpus),
                     str(max(gpu.gpus - gpu.free_gpus, 0)), str(gpu.free_gpus), "", "",
                     f"resident: {resident or 'none'}")]
    for api in inventory.api_pools:
        if pool == f"api/{api.name}":
            return [("", "", "", "", "", "", "",
                     f"quota {api.quota or 'none'}, {api.waiting} waiting for slots")]
    return []


def _queues_table(inventory: Inventory) -> Table:
    table = Table(title="queues (ready per priority; 0 runs first)", title_justify="left",
                  box=box.SIMPLE_HEAD)
    for column in ("queue", "pool", "ready", "unacked", "by priority"):
        table.add_column(column, justify="right" if column in {"ready", "unacked"} else "left",
                         no_wrap=column != "by priority")
    for queue in inventory.queues:
        spread = " ".join(f"p{step}={count}" for step, count in queue.by_priority if count)
        table.add_row(queue.queue, queue.pool, str(queue.ready), str(queue.unacked), spread)
    return table


def _notes(data: StatusData) -> list[Text]:
    notes = []
    if not data.inventory.gpu_pools:
        notes.append(f"no GPU pool publishes its inventory in Redis ({keys.GPU_POOLS} is empty): "
                     "GPU units and resident models are unknown; GPU queues are still shown")
    line = data.inventory.memory_line
    if line.waiting:
        notes.append(f"{line.waiting} trajectories wait for memory on the CPU pool "
                     f"({line.memory_mb:g} MB asked, the oldest for {line.oldest_wait_s:.1f} s): "
                     "add CPU nodes or memory, or end idle trajectories")
    if not data.inspected:
        notes.append("workers were not inspected (inspect timeout 0)")
    elif not data.consumers:
        notes.append("no Celery worker answered the inspect: none is running, or all are busy")
    return [Text(note, style="dim") for note in notes]


def _pool_queues(inventory: Inventory, pool: str) -> list[QueueDepth]:
    return [q for q in inventory.queues if q.pool == pool]


def _workers(data: StatusData, queues: Sequence[QueueDepth]) -> str:
    if not data.inspected:
        return ""
    workers = sorted({w for q in queues for w in data.consumers.get(q.queue, ())})
    return ", ".join(workers) if workers else "no worker consuming"


def _depth(queue: QueueDepth | None) -> tuple[str, str]:
    return ("", "") if queue is None else (str(queue.ready), str(queue.unacked))


def _num(value: int | None) -> str:
    return "-" if value is None else str(value)


def _yes(alive: bool) -> str:
    return "yes" if alive else "NO"


if __name__ == "__main__":
    sys.exit(main())
