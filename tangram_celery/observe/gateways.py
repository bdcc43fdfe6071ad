"""The gateways ``tangram status`` shows: what each running ``tangram gateway`` publishes.

A gateway writes ``address``, ``served``, ``in_flight`` and ``at`` (epoch seconds) as JSON under
its name in :data:`~tangram_celery.keys.GATEWAYS` every few seconds; :func:`gateway_views` reads
that hash (pure), :func:`read_gateways` does the Redis call, :func:`gateways_table` renders it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import redis
from rich import box
from rich.table import Table

from tangram_celery import keys

STALE_AFTER_S = 10.0
"""A gateway that has not published for this long is shown as not alive."""


@dataclass(frozen=True)
class GatewayView:
    """One gateway as ``tangram status`` shows it."""

    name: str
    address: str
    served: int
    in_flight: int
    alive: bool


def gateway_views(raw: Mapping[bytes | str, bytes | str], now: float,
                  stale_after_s: float = STALE_AFTER_S) -> tuple[GatewayView, ...]:
    """The gateways in a :data:`~tangram_celery.keys.GATEWAYS` hash, by name; entries that are
    not JSON objects are skipped."""
    views = []
    for name, value in raw.items():
        try:
            data = json.loads(value)
        except ValueError:
            continue
        if not isinstance(data, Mapping):
            continue
        at = data.get("at")
        fresh = isinstance(at, int | float) and now - at <= stale_after_s
        views.append(GatewayView(
            name=name.decode() if isinstance(name, bytes) else name,
            address=str(data.get("address", "")),
            served=_count(data.get("served")),
            in_flight=_count(data.get("in_flight")),
            alive=fresh,
        ))
    return tuple(sorted(views, key=lambda view: view.name))


def read_gateways(client: redis.Redis, now: float) -> tuple[GatewayView, ...]:
    """The gateways published in Redis."""
    raw: Mapping[bytes | str, bytes | str] = client.hgetall(keys.GATEWAYS)
    return gateway_views(raw, now)


def gateways_table(gateways: Sequence[GatewayView]) -> Table:
    """One row per gateway: name, address, alive, requests served and in flight."""
    table = Table(title="gateways (SandboxFusion /run_code)", title_justify="left",
                  box=box.SIMPLE_HEAD)
    for column in ("gateway", "address", "alive", "served", "in flight"):
        table.add_column(column, justify="right" if column in {"served", "in flight"} else "left",
                         no_wrap=True)
    for view in gateways:
        table.add_row(view.name, view.address, "yes" if view.alive else "NO", str(view.served),
                      str(view.in_flight))
    return table


def _count(raw: object) -> int:
    return int(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) else 0
