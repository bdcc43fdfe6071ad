"""The controller's pure helpers (plain data) and one tick loop against real Redis and workers."""

from __future__ import annotations

import argparse
import base64
import json
import logging
import threading
import time
from pathlib import Path

import pytest
import redis

from tangram_bench.emulation import emulated_exec, emulated_test_run
from tangram_celery import keys
from tangram_celery.autoscale.actuators import LocalProcessActuator
from tangram_celery.autoscale.actuators.members import RESTART_BACKOFF_S
from tangram_celery.autoscale.controller import (
    AutoscalerOptions,
    RecentAct,
    add_arguments,
    cpu_load,
    local_controller,
    options_from_args,
    recent_act,
    worker_env,
)
from tangram_celery.autoscale.policy import Budget, PoolLimits, ScalingConfig, decide
from tangram_celery.autoscale.work import Work, action_work, message_body, unacked_work
from tangram_celery.client import TangramClient
from tangram_celery.errors import ConfigError
from tangram_celery.pools.inventory import (
    Inventory,
    MemoryLine,
    QueueDepth,
    memory_line,
    read_inventory,
)
from tangram_celery.pools.registry import NodeView, Registry
from tangram_celery.settings import Settings
from tangram_celery.tasks.actlog import ActRecord


def kombu_message(body: object) -> str:
    """A kombu Redis message carrying one task argument, as Celery stores it."""
    raw = json.dumps([[body], {}, {}]).encode()
    return json.dumps({"body": base64.b64encode(raw).decode(), "content-encoding": "utf-8",
                       "properties": {"body_encoding": "base64"}, "headers": {}})


def test_message_work_reads_expected_durations() -> None:
    declared = emulated_test_run("t1", t1=4.0, p=0.9, max_units=4).to_json()
    short = emulated_exec("t2", 0.5).to_json()
    assert message_body(kombu_message(declared)) == declared
    assert action_work(declared) == Work(4.0, 0, 1)
    assert action_work(short) == Work(0.5, 0, 1)
    assert action_work({"kind": "nonsense"}) == Work(0.0, 1, 1)
    assert message_body(b"not json") is None


def test_unacked_work_keeps_only_the_pool_queues() -> None:
    msg = kombu_message(emulated_exec("t", 2.0).to_json())
    values = [json.dumps([json.loads(msg), "", "tangram.cpu.a"]),
              json.dumps([json.loads(msg), "", "tangram.gpu.x"]), "garbage"]
    assert unacked_work(values, {"tangram.cpu.a"}) == Work(2.0, 0, 1)


def test_recent_act_means_over_the_window() -> None:
    def rec(pool: str, queue_s: float, at: float) -> ActRecord:
        return ActRecord("exec", pool, "q", "n", "ok", queue_s, 1.0, 0.0, queue_s + 1, at)

    records = [rec("cpu", 2.0, 100), rec("cpu", 4.0, 101), rec("cpu", 50.0, 10),
               rec("gpu/a", 9.0, 100)]
    assert recent_act(records, "cpu", since=50) == RecentAct(3.0, 1.0, 2)
    assert recent_act(records, "api/x", since=0) == RecentAct()


def test_cpu_load_splits_prefetched_from_running() -> None:
    inventory = Inventory(
        at=0.0,
        nodes=(NodeView("a", 4, 1, 8192, 0), NodeView("dead", 4, 0, 8192, 0, alive=False)),
        gpu_pools=(), api_pools=(),
        queues=(QueueDepth("tangram.cpu.a", "cpu", ((0, 2), (3, 1)), unacked=5),),
    )
    load = cpu_load(inventory, Work(6.0, 1, 3), Work(5.0, 0, 5), RecentAct(0.5, 1.0, 4),
                    size=1, member_units=4, since_scale_s=7.0)
    assert (load.ready, load.running_units, load.prefetched) == (3, 3, 2)
    assert load.predicted_work_s == pytest.approx(6.0 + 5.0 * 2 / 5)
    assert (load.unknown, load.recent_exec_s, load.since_scale_s) == (1, 1.0, 7.0)
    assert (load.memory_mb, load.memory_waiting, load.member_memory_mb) == (0.0, 0, 0.0)


def test_cpu_load_counts_held_memory_and_the_memory_line() -> None:
    infos = {b"w1": json.dumps({"memory_mb": 512, "since": 90.0}),
             b"w2": json.dumps({"memory_mb": 1024, "since": 95.0}),
             b"dead": json.dumps({"memory_mb": 4096, "since": 10.0}), b"bad": b"{"}
    line = memory_line(infos, [(b"w1", 101.0), (b"w2", 105.0), (b"dead", 50.0),
                               (b"bad", 110.0)], now=100.0)
    assert line == MemoryLine(3, 1536.0, 10.0)
    inventory = Inventory(
        at=100.0, nodes=(NodeView("a", 2, 2, 8192, 8000), NodeView("b", 2, 2, 8192, 700,
                                                                     alive=False)),
        gpu_pools=(), api_pools=(), queues=(), memory_line=line)
    load = cpu_load(inventory, Work(), Work(), RecentAct(), size=1, member_units=2,
                    since_scale_s=9.0, member_memory_mb=8192)
    assert (load.memory_mb, load.memory_waiting) == (8000 + 1536.0, 3)
    (target,) = decide([load], Budget({}, {"cpu": PoolLimits(1, 8)})).targets
    assert (target.target, target.action) == (2, "up"), target.describe()


@pytest.mark.slow
def test_controller_grows_on_a_burst_and_drains_back(
    settings: Settings, redis_client: redis.Redis, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Real Redis, real node workers: a burst of 1 s actions grows the pool, every decision is
    logged and published, and the idle pool drains back to its minimum."""
    caplog.set_level(logging.INFO, logger="tangram_celery.autoscale")
    options = AutoscalerOptions(interval_s=0.3, node_cores=2, min_nodes=1, max_nodes=3,
                                drain_timeout_s=20.0,
                                scaling=ScalingConfig(target_wait_s=2.0, down_hold_s=1.0))
    controller = local_controller(settings, options, tmp_path, prefix="t")
    stop = threading.Event()
    thread = threading.Thread(target=controller.run, args=(stop,), daemon=True)
    thread.start()
    try:
        _wait(lambda: controller.actuator.sizes()["cpu"] == 1 and _alive(redis_client, "t-1"))
        with TangramClient(settings) as client:
            handles = [client.submit(emulated_exec(f"traj-{i}", 1.0)) for i in range(12)]
            _wait(lambda: controller.actuator.sizes()["cpu"] >= 2, timeout=10)
            results = [h.result(timeout=60) for h in handles]
            for i in range(12):
                client.end_trajectory(f"traj-{i}")
        assert all(r.ok for r in results)
        _wait(lambda: _inventory_shows_the_published_target(redis_client, settings), timeout=10)
        _wait(lambda: controller.actuator.sizes()["cpu"] == 1
              and not controller.actuator.draining(),  # type: ignore[attr-defined]
              timeout=40)
    finally:
        stop.set()
        thread.join(5)
        controller.actuator.close()
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("autoscale")]
    assert any("(up;" in line for line in logged) and any("(down;" in line for line in logged)


def _inventory_shows_the_published_target(client: redis.Redis, settings: Settings) -> bool:
    """The inventory's autoscale view and the published record agree (the controller keeps
    publishing, so the two reads are retried until they fall between two decisions)."""
    published = client.hgetall(keys.autoscale_pool("cpu"))
    (view,) = read_inventory(client, settings).autoscale
    return (b"reason" in published and int(published[b"target"]) >= 1 and bool(view.reason)
            and (view.pool, view.target) == ("cpu", int(published[b"target"])))


def _alive(client: redis.Redis, node: str) -> bool:
    raw = client.hget(keys.node(node), "heartbeat")
    return raw is not None and time.time() - float(raw) < 5


def _wait(condition: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"condition not met within {timeout} s")


def test_options_come_from_settings_and_flags_override_them() -> None:
    settings = Settings.from_env({"TANGRAM_AUTOSCALE_MAX_NODES": "5",
                                  "TANGRAM_AUTOSCALE_DOWN_HOLD_S": "7"})
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    options = options_from_args(parser.parse_args(["--min-nodes", "2"]), settings)
    assert (options.min_nodes, options.max_nodes, options.scaling.down_hold_s) == (2, 5, 7.0)
    assert options_from_args(parser.parse_args([]), settings).min_nodes == 1
    with pytest.raises(ConfigError, match="TANGRAM_AUTOSCALE_MAX_NODES=5 must be"):
        options_from_args(parser.parse_args(["--min-nodes", "6"]), settings)
    with pytest.raises(ConfigError, match="TANGRAM_AUTOSCALE_NODE_CORES must be positive"):
        Settings.from_env({"TANGRAM_AUTOSCALE_NODE_CORES": "0"})


def test_a_member_that_dies_is_started_again_and_serves_its_queue(
    settings: Settings, redis_client: redis.Redis, tmp_path: Path,
) -> None:
    """A node worker SIGKILLed while its pool should hold it is started again under its name
    (after the restart back-off), so actions queued for it still run."""
    offset = [0.0]
    actuator = LocalProcessActuator(
        redis_client, worker_env(settings), 1, 4096, tmp_path, prefix="r",
        clock=lambda: time.time() + offset[0],
        registry=Registry(redis_client, settings.node.ttl_s, settings.actions.trajectory_ttl_s),
    )
    try:
        actuator.scale("cpu", 1)
        (member,) = actuator.active()
        _wait(lambda: redis_client.hget(keys.node("r-1"), "starting") is None)
        member.handle.kill()  # type: ignore[attr-defined]
        member.handle.wait(10)  # type: ignore[attr-defined]
        member.started = time.time()  # however long it took to start, the back-off holds
        with TangramClient(settings) as client:
            handle = client.submit(emulated_exec("dies-1", 0.1))
            actuator.step()
            assert member.handle.poll() is not None  # type: ignore[attr-defined]
            offset[0] = RESTART_BACKOFF_S
            actuator.step()
            assert member.handle.poll() is None  # type: ignore[attr-defined]
            assert handle.queue == keys.cpu_queue("r-1") and handle.result(timeout=60).ok
    finally:
        actuator.close()
