"""The gateways ``tangram status`` shows, read from what each gateway publishes (plain data)."""

from __future__ import annotations

import json

from rich.console import Console

from tangram_celery.observe.gateways import gateway_views, gateways_table


def test_views_from_the_published_hash() -> None:
    raw = {b"h:8080": json.dumps({"address": "http://127.0.0.1:8080", "served": 7,
                                  "in_flight": 2, "at": 100.0}).encode(),
           "old:1": json.dumps({"address": "http://x:1", "served": 1, "at": 10.0}),
           b"junk": b"not json", b"list": b"[1]"}
    views = gateway_views(raw, now=105.0)
    assert [(v.name, v.served, v.in_flight, v.alive) for v in views] == [
        ("h:8080", 7, 2, True), ("old:1", 1, 0, False)]
    console = Console(record=True, width=160)
    console.print(gateways_table(views))
    text = console.export_text()
    assert "http://127.0.0.1:8080" in text and "NO" in text
