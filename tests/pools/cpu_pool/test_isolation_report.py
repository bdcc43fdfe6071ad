"""A best-effort node says what it does not enforce: in its registration (``tangram status``,
the dashboard) and in every result. A real node runtime, a real bubblewrap backend without
cgroups (as a node without root or delegation runs) and a real Redis."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import redis
from rich.console import Console

from tangram_celery.observe.dashboard import dashboard_view
from tangram_celery.observe.status import StatusData, render_status
from tangram_celery.pools.cpu_pool import CpuNode
from tangram_celery.pools.inventory import read_inventory
from tangram_celery.pools.registry import Registry
from tangram_celery.sandbox import SandboxLimits
from tangram_celery.sandbox.bwrap import BwrapBackend
from tangram_celery.settings import Settings


def test_a_best_effort_node_reports_its_gaps_everywhere(
        settings: Settings, registry: Registry, redis_client: redis.Redis) -> None:
    root = Path("/var/tmp") / f"tangram-iso-test-{uuid.uuid4().hex[:10]}"
    backend = BwrapBackend(root, SandboxLimits(memory_mb=128), cgroups=False,
                           enforce="best-effort", ready=0)
    node = CpuNode(settings, "iso-node", 1, [0], 1024.0, backend, registry)
    node.start()
    try:
        result = node.execute({"trajectory_id": "t", "kind": "exec", "cost": {"cpu": 1},
                               "payload": {"cmd": "echo hi"}}, time.time())
        inventory = read_inventory(redis_client, settings)
    finally:
        node.stop()
    assert result["status"] == "ok", result
    assert result["isolation"].startswith("best-effort, not enforced: memory, pids")
    [view] = [n for n in inventory.nodes if n.name == "iso-node"]
    assert view.isolation == result["isolation"]
    console = Console(record=True, width=400)
    console.print(render_status(StatusData(inventory, {}, inspected=True)))
    assert "isolation best-effort, not enforced: memory" in console.export_text()
    [row] = dashboard_view([], inventory, time.time())["isolation"]
    assert row == {"node": "iso-node", "isolation": view.isolation, "enforced": False}
