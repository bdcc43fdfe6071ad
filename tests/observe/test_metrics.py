"""The ACT log, the inventory and ``tangram exporter``: pure parts on plain data, then a real
exporter scraped over HTTP while real workers run a known batch."""

from __future__ import annotations

import time
import types
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
import redis
from kombu.transport.redis import Channel
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tangram_celery import keys
from tangram_celery.client import TangramClient, command_action
from tangram_celery.observe.metrics import ActMetrics, exporter, inventory_families
from tangram_celery.pools.inventory import (
    AutoscaleView,
    GpuPoolView,
    Inventory,
    QueueDepth,
    Resident,
    gpu_pool_view,
    priority_lists,
    read_inventory,
    routing_key_of_unacked,
    unacked_by_queue,
)
from tangram_celery.pools.registry import NodeView, Registry
from tangram_celery.settings import Settings
from tangram_celery.tasks.actlog import ActRecord
from tangram_celery.tasks.app import celery_config, make_app

CpuWorkers = Callable[..., list[str]]


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample of a Prometheus text exposition, or None."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def wait_until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


def test_priority_lists_are_named_as_kombu_names_them() -> None:
    options = celery_config(Settings())["broker_transport_options"]
    kombu_priority: Any = Channel.priority
    kombu_list: Any = Channel._q_for_pri
    channel = types.SimpleNamespace(sep=options["sep"], priority_steps=options["priority_steps"])
    channel.priority = lambda n: kombu_priority(channel, n)
    ours = dict(priority_lists("tangram.cpu.a", options["sep"], options["priority_steps"]))
    assert ours == {p: kombu_list(channel, "tangram.cpu.a", p) for p in range(10)}
    assert ours[0] == "tangram.cpu.a" and ours[7] == "tangram.cpu.a:7"


def test_unacked_values_name_their_queue() -> None:
    value = '[{"body": "eyJ4IjogMX0=", "headers": {"a": "]\\""}}, "tangram.cpu.n", "tangram.cpu.n"]'
    assert routing_key_of_unacked(value[-600:]) == "tangram.cpu.n"
    assert routing_key_of_unacked(b"garbage") is None
    counts = unacked_by_queue([value, value, '[{}, "", "tangram.gpu.default"]', "x"])
    assert counts == {"tangram.cpu.n": 2, "tangram.gpu.default": 1}


def test_act_metrics_histograms_count_a_known_set() -> None:
    registry = CollectorRegistry()
    metrics = ActMetrics(registry)
    for exec_s, status in ((0.004, "ok"), (0.2, "ok"), (3.0, "failed")):
        metrics.observe(ActRecord("exec", "cpu", "q", "n", status, 0.01, exec_s, 0.001,
                                  exec_s + 0.011, 0.0))
    text = generate_latest(registry).decode()
    labels = {"kind": "exec", "pool": "cpu"}
    assert sample(text, "tangram_action_exec_seconds_count", **labels) == 3
    assert sample(text, "tangram_action_exec_seconds_sum", **labels) == pytest.approx(3.204)
    assert sample(text, "tangram_action_exec_seconds_bucket", le="0.005", **labels) == 1
    assert sample(text, "tangram_action_exec_seconds_bucket", le="0.25", **labels) == 2
    assert sample(text, "tangram_action_queue_seconds_sum", **labels) == pytest.approx(0.03)
    assert sample(text, "tangram_actions_total", status="failed", **labels) == 1
    assert sample(text, "tangram_exporter_act_records_total") == 3


def test_inventory_families_and_pool_totals() -> None:
    inventory = Inventory(
        at=0.0,
        nodes=(NodeView("a", 4, 1, 8192, 0, alive=True), NodeView("b", 8, 8, 8192, 0, alive=False)),
        gpu_pools=(GpuPoolView("big", 8, 6, True, "gpu-big@h", ("rm",),
                               (Resident("rm", (0, 1)), Resident("rm", (4,)))),),
        api_pools=(),
        queues=(QueueDepth(keys.cpu_queue("a"), "cpu", ((0, 2), (5, 1)), unacked=3),
                QueueDepth(keys.gpu_queue("big"), "gpu/big", ((0, 4),), unacked=1)),
        autoscale=(AutoscaleView("cpu", target=3, actual=1),),
    )
    text = generate_latest(_registry_of(inventory)).decode()
    assert sample(text, "tangram_queue_depth", queue="tangram.cpu.a") == 3
    assert sample(text, "tangram_queue_messages", queue="tangram.cpu.a", priority="5") == 1
    assert sample(text, "tangram_queue_unacked", queue="tangram.cpu.a") == 3
    assert sample(text, "tangram_pool_units", pool="cpu", resource="cpu") == 4
    assert sample(text, "tangram_pool_units_allocated", pool="cpu") == 3
    assert sample(text, "tangram_pool_members_alive", pool="cpu") == 1
    assert sample(text, "tangram_pool_units_allocated", pool="gpu/big", resource="gpu") == 2
    assert sample(text, "tangram_gpu_resident_gpus", pool="gpu/big", model="rm") == 3
    assert sample(text, "tangram_node_alive", node="b") == 0
    assert sample(text, "tangram_autoscale_target_members", pool="cpu") == 3
    assert sample(text, "tangram_autoscale_actual_members", pool="cpu") == 1


def _registry_of(inventory: Inventory) -> CollectorRegistry:
    class Fixed:
        def collect(self) -> list[object]:
            return list(inventory_families(inventory))

    registry = CollectorRegistry()
    registry.register(Fixed())  # type: ignore[arg-type]
    return registry


def test_gpu_pool_view_tolerates_malformed_fields() -> None:
    view = gpu_pool_view("p", {b"gpus": b"4", b"models": b"not json", b"residents": b"[1, {}]",
                               b"heartbeat": b"100"}, now=105.0, ttl_s=10.0)
    assert (view.gpus, view.free_gpus, view.alive, view.models, view.residents) == (
        4, 0, True, (), ())


def test_read_inventory_counts_every_priority_sub_list(
    settings: Settings, redis_client: redis.Redis
) -> None:
    app = make_app(settings)
    queue = keys.cpu_queue("nobody")
    for priority in (0, 0, 3, 9, 9, 9):
        app.send_task(keys.task_name("exec"), args=[{}], queue=queue, priority=priority)
    inventory = read_inventory(redis_client, settings, extra_queues=[queue])
    depth = inventory.queue(queue)
    assert depth is not None and depth.ready == 6
    assert {p: n for p, n in depth.by_priority if n} == {0: 2, 3: 1, 9: 3}


@pytest.mark.slow
def test_exporter_scrape_matches_a_known_batch(
    settings: Settings, cpu_workers: CpuWorkers, redis_client: redis.Redis, registry: Registry
) -> None:
    with exporter(settings, port=0) as running:
        cpu_workers({"mx-a": 2})
        registry.register_node("mx-ghost", 4, 1024)
        registry.deregister_node("mx-ghost")
        app = make_app(settings)
        for priority in (0, 5, 5, 9):
            app.send_task(keys.task_name("exec"), args=[{}], queue=keys.cpu_queue("mx-ghost"),
                          priority=priority)
        with TangramClient(settings) as client:
            handles = [client.submit(command_action("mx-t", "sleep 1", cpu=2)) for _ in range(3)]

            def busy() -> bool:
                text = scrape(running.url)
                return (sample(text, "tangram_queue_unacked", queue="tangram.cpu.mx-a") == 3
                        and sample(text, "tangram_pool_units_allocated", pool="cpu") == 2)

            wait_until(busy, timeout=2.5)
            results = [h.result(60) for h in handles]
            client.end_trajectory("mx-t")
        assert all(r.ok for r in results), [r.output for r in results]
        labels = {"kind": "exec", "pool": "cpu"}
        wait_until(lambda: sample(scrape(running.url), "tangram_actions_total", status="ok",
                                  **labels) == 3)
        text = scrape(running.url)
    exec_sum = sum(r.act["exec"] for r in results)
    assert sample(text, "tangram_exporter_redis_up") == 1
    for part in ("act", "queue", "exec", "overhead"):
        assert sample(text, f"tangram_action_{part}_seconds_count", **labels) == 3
    assert sample(text, "tangram_action_exec_seconds_sum", **labels) == pytest.approx(exec_sum,
                                                                                     abs=1e-4)
    assert sample(text, "tangram_action_exec_seconds_bucket", le="0.5", **labels) == 0
    assert sample(text, "tangram_action_exec_seconds_bucket", le="+Inf", **labels) == 3
    queue_sum = sample(text, "tangram_action_queue_seconds_sum", **labels)
    assert queue_sum == pytest.approx(sum(r.act["queue"] for r in results), abs=0.3)
    assert queue_sum is not None and queue_sum > 2.5, "the 2nd and 3rd waited for both cores"
    act_sum = sample(text, "tangram_action_act_seconds_sum", **labels)
    assert act_sum is not None and exec_sum <= act_sum <= sum(r.act["total"] for r in results)
    ghost = {"queue": "tangram.cpu.mx-ghost", "pool": "cpu"}
    assert sample(text, "tangram_queue_depth", **ghost) == 4
    assert [sample(text, "tangram_queue_messages", priority=str(p), **ghost)
            for p in (0, 5, 9)] == [1, 2, 1]
    assert sample(text, "tangram_pool_units", pool="cpu", resource="cpu") == 2
    assert sample(text, "tangram_pool_members_alive", pool="cpu") == 1
    assert sample(text, "tangram_node_cores", node="mx-ghost") == 4
    assert sample(text, "tangram_node_alive", node="mx-ghost") == 0


def test_exporter_reports_redis_down_without_failing(settings: Settings) -> None:
    dead = settings.with_(redis_url="redis://127.0.0.1:1/0")
    with exporter(dead, port=0) as running:
        text = scrape(running.url)
    assert sample(text, "tangram_exporter_redis_up") == 0
