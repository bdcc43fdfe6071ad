"""Trajectories wait for memory instead of failing, end to end: a real Redis, a real
``tangram worker cpu`` whose memory admits 16 trajectories, two clients submitting 32."""

from __future__ import annotations

import time

import pytest
from conftest import CpuWorkers

from tangram_celery.client import TangramClient, command_action
from tangram_celery.errors import NoCapacityError
from tangram_celery.pools.registry import Registry
from tangram_celery.settings import Settings

NODE_MB = 8192
"""What ``tangram worker cpu`` offers by default: 16 trajectories of the default 512 MB."""


@pytest.mark.slow
def test_32_trajectories_on_a_node_for_16_all_finish_in_fcfs_order(
    settings: Settings, cpu_workers: CpuWorkers, registry: Registry,
) -> None:
    cpu_workers({"mem-a": 2})
    assert settings.actions.trajectory_memory_mb * 16 == NODE_MB
    with TangramClient(settings) as one, TangramClient(settings) as two:
        clients = [one, two]
        handles = []
        started = time.monotonic()
        for i in range(32):
            owner = clients[0] if i < 16 else clients[i % 2]
            handles.append((owner, owner.submit(command_action(f"m{i:02d}", "echo done"))))
        assert time.monotonic() - started < 20, "submit does not block on memory"
        assert [h.queue == "" for _, h in handles] == [False] * 16 + [True] * 16
        assert sum(v.reserved_mb for v in registry.nodes()) == NODE_MB
        for i, (owner, handle) in enumerate(handles):
            result = handle.result(timeout=120)
            assert result.ok and result.output["stdout"] == "done\n", result
            assert result.node == "mem-a"
            owner.end_trajectory(f"m{i:02d}")
        admitted = one._router.tickets.admissions()
        assert [a["trajectory"] for a in admitted] == [f"m{i:02d}" for i in range(16, 32)]
        assert all(a["waited_s"] > 0 for a in admitted)

        with pytest.raises(NoCapacityError) as never:
            one.submit(command_action("huge", "true", trajectory_memory_mb=NODE_MB + 1))
        message = str(never.value)
        assert f"asks for {NODE_MB + 1} MB" in message
        assert f"largest live node has {NODE_MB} MB" in message

        hog = one.submit(command_action("hog", "true", trajectory_memory_mb=8000))
        assert hog.result(timeout=60).ok
        waited = time.monotonic()
        late = two.submit(command_action("late", "true", trajectory_memory_mb=500, timeout_s=1.5))
        assert late.queue == ""
        result = late.result(timeout=30)
        assert time.monotonic() - waited >= 1.4
        assert result.status == "no_capacity" and not result.ok
        assert "waited" in result.error and "for 500 MB of memory" in result.error
        assert (f"1 live node(s) with {NODE_MB} MB in all, {NODE_MB - 8000} MB unreserved"
                in result.error), result.error
        one.end_trajectory("hog")
