"""A real CPU node (real Redis, a real worker process, bubblewrap with cgroups) resizes its
malleable test runs while they run (``TANGRAM_MALLEABLE_RESIZE``, on by default, for elastic
pytest actions that say nothing of it): a run admitted on one core grows when another action's
core frees up, and an exec action arriving while a run holds every core starts on a core taken
back from it. The order comes from gate files in the work dirs and the run's own log; nothing
is timed."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis
from malleable_runs import gated_suite
from test_core_loans import check_exclusive

from tangram_celery import keys
from tangram_celery.client import TangramClient, command_action, test_run_action
from tangram_celery.pools.conversion import MALLEABLE_CONTROL
from tangram_celery.pools.cpu_pool import CpuNode
from tangram_celery.pools.duration_sharing import parse_entry
from tangram_celery.pools.registry import Registry
from tangram_celery.sandbox import SandboxLimits
from tangram_celery.sandbox.bwrap import BwrapBackend
from tangram_celery.sandbox.malleable import resize
from tangram_celery.settings import Settings

pytestmark = pytest.mark.slow

CpuWorkers = Callable[..., list[str]]
WAIT_S = 120.0
RESIZING = {"TANGRAM_SCHEDULER": "fcfs-min", "TANGRAM_MALLEABLE_START_S": "0.1"}
"""Resizing is on by default: the runs below say nothing of it."""

SUITE = gated_suite('"/work/run-log"', '"/work/run-gate"', 6, "WORK_WAITS", deadline_s=240,
                    head='WORK_WAITS = pathlib.Path("/work/suite/work-waits").exists()',
                    tail='    assert i != 5, "the one failing test"\n')
BLOCKER = ("python3 -c \"import pathlib, time\n"
           "pathlib.Path('/work/blocker-started').touch()\n"
           "deadline = time.monotonic() + 240\n"
           "while not pathlib.Path('/work/blocker-gate').exists():\n"
           "    assert time.monotonic() < deadline\n"
           "    time.sleep(0.02)\"")


@pytest.fixture()
def cpuset() -> None:
    """The worker's bubblewrap backend can re-pin running actions: a writable cpuset cgroup."""
    root = Path("/var/tmp") / f"tangram-mall-check-{uuid.uuid4().hex[:10]}"
    backend = BwrapBackend(root, SandboxLimits(memory_mb=128), ready=0)
    try:
        writable = backend.cgroups is not None and "cpuset" in backend.cgroups.controllers
    finally:
        backend.close()
        shutil.rmtree(root, ignore_errors=True)
    if not writable:
        if os.geteuid() == 0:
            pytest.fail("no writable cgroup cpuset controller although running as root: mount "
                        "the cpuset cgroup controller")
        pytest.skip("needs a writable cgroup cpuset controller (run as root)")


def wait_for(find: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while not (found := find()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return found


def one(root: Path, name: str) -> Path | None:
    return next(iter(root.rglob(name)), None)


def log_lines(log: Path) -> list[tuple[str, str, str]]:
    return [(p, n, c) for p, n, c in (line.split() for line in log.read_text().splitlines())]


def malleable_run(trajectory_id: str, work_waits: bool = True) -> Any:
    """An elastic pytest action of seven tests (the node makes it a malleable run: it says
    nothing of it): the first waits for the run's gate, and so do the others when
    ``work_waits``."""
    files = {"suite/test_resize.py": SUITE, **({"suite/work-waits": ""} if work_waits else {})}
    return test_run_action(
        trajectory_id, "python3 -m pytest -q -p no:cacheprovider suite", cpu=(1, 2),
        elasticity="linear", t1=60.0, signature="resize-suite", payload={"files": files})


def check_verdict(result: Any) -> None:
    """The run's verdict is a plain run's: one test failed, six passed, exit status 1."""
    assert result.status == "failed", result.output
    assert result.output["exit_code"] == 1
    assert "1 failed, 6 passed" in result.output["stdout"], result.output["stdout"][-3000:]


def allocations(registry: Registry, node: str) -> list[dict[str, Any]]:
    records = registry.allocations(node)
    check_exclusive(records)
    return records


def test_a_run_on_one_core_grows_when_another_actions_core_frees_up(
        settings: Settings, cpu_workers: CpuWorkers, registry: Registry, cpuset: None,
        redis_client: redis.Redis,
) -> None:
    cpu_workers({"ml-grow": 2}, **RESIZING)
    root = settings.sandbox.root
    with TangramClient(settings) as client:
        blocker = client.submit(command_action("g-blocker", BLOCKER))
        started = wait_for(lambda: one(root, "blocker-started"), "the blocker to start")
        run = client.submit(malleable_run("g-run"))
        log = wait_for(lambda: one(root, "run-log"), "the run's first test")
        assert len({pid for pid, _, _ in log_lines(log)}) == 1
        started.with_name("blocker-gate").touch()
        assert blocker.result(WAIT_S).ok
        wait_for(lambda: len({pid for pid, _, _ in log_lines(log)}) == 2,
                 "a second worker on the core the blocker gave back")
        log.with_name("run-gate").touch()
        result = run.result(WAIT_S)
        lines = log_lines(log)
        client.end_trajectory("g-run")
        client.end_trajectory("g-blocker")
    check_verdict(result)
    assert len(result.units) == 1, "admitted on the one core left"
    second = [c for pid, _, c in lines if pid != lines[0][0]]
    assert len(second[0].split(",")) == 2, "the new worker runs on the grown cpuset"
    held = [r for r in allocations(registry, "ml-grow") if r["action_id"] == result.action_id]
    assert max(len(r["units"]) for r in held) == 2, held
    stream: Any = redis_client.xrange(keys.duration_log())
    learned = [parse_entry(fields) for _, fields in stream]
    runs = [(entry[2], entry[3]) for entry in learned
            if entry is not None and entry[1][1] == "resize-suite"]
    assert len(runs) == 1 and runs[0][0] in (1, 2), ("the resized run is learned at the cores "
                                                     "it held on average", runs)
    assert runs[0][1] == pytest.approx(result.timings.exec_s, rel=1e-3)


def test_an_exec_action_takes_a_core_back_from_a_run_holding_every_core(
        settings: Settings, cpu_workers: CpuWorkers, registry: Registry, cpuset: None,
) -> None:
    cpu_workers({"ml-take": 2}, **RESIZING)
    root = settings.sandbox.root
    with TangramClient(settings) as client:
        run = client.submit(malleable_run("t-run"))
        log = wait_for(lambda: one(root, "run-log"), "the run's first test")
        wait_for(lambda: len({pid for pid, _, _ in log_lines(log)}) == 2,
                 "the run to grow onto the idle core")
        exec_result = client.submit(command_action("t-exec", "echo took-a-core")).result(WAIT_S)
        assert not log.with_name("run-gate").exists()
        log.with_name("run-gate").touch()
        result = run.result(WAIT_S)
        client.end_trajectory("t-run")
        client.end_trajectory("t-exec")
    assert exec_result.ok and "took-a-core" in exec_result.output["stdout"]
    check_verdict(result)
    records = allocations(registry, "ml-take")
    mine = [r for r in records if r["action_id"] == result.action_id]
    (taken,) = exec_result.units
    assert any(taken in r["units"] and r["end"] <= exec_result.timings.admitted + 1e-3
               for r in mine), ("the exec action runs on a core the run held before", mine)
    assert all(len(r["units"]) == 1 for r in records if r["action_id"] == exec_result.action_id)


def test_a_core_no_worker_will_use_goes_back_without_asking_the_run(
        settings: Settings, cpu_workers: CpuWorkers, registry: Registry, cpuset: None,
) -> None:
    """The run grew to two workers and one drained the queue: its core is taken back from the
    cpuset alone (the run is not asked to retire a worker, and no third worker starts for the
    ids its workers hold) and an arriving exec action runs on it."""
    cpu_workers({"ml-idle": 2}, **RESIZING)
    root = settings.sandbox.root
    with TangramClient(settings) as client:
        run = client.submit(malleable_run("i-run", work_waits=False))
        log = wait_for(lambda: one(root, "run-log"), "the run's first test")
        control = str(log.with_name(MALLEABLE_CONTROL))
        wait_for(lambda: (lambda s: s["active"] == 1 and s["done"] == 5)(resize(control, "status")),
                 "the second worker to drain the queue while the first waits at the gate")
        assert len({pid for pid, _, _ in log_lines(log)}) == 2
        exec_result = client.submit(command_action("i-exec", "echo took-a-core")).result(WAIT_S)
        status = resize(control, "status")
        log.with_name("run-gate").touch()
        result = run.result(WAIT_S)
        client.end_trajectory("i-run")
        client.end_trajectory("i-exec")
    assert exec_result.ok
    assert status["workers"] == 2, "the run was neither asked to retire a worker nor grown"
    check_verdict(result)
    held = [r for r in allocations(registry, "ml-idle") if r["action_id"] == result.action_id]
    assert [len(r["units"]) for r in sorted(held, key=lambda r: r["start"])] == [1, 2, 1]


def test_without_a_writable_cpuset_a_run_keeps_its_cores_and_its_verdict(
        settings: Settings, registry: Registry) -> None:
    """bubblewrap without cgroups cannot re-pin a running action: the node's one try to grow
    the run is undone and not repeated, and the run ends on the core it was admitted on."""
    root = Path("/var/tmp") / f"tangram-mall-test-{uuid.uuid4().hex[:10]}"
    backend = BwrapBackend(root, SandboxLimits(memory_mb=512), cgroups=False,
                           enforce="best-effort", ready=0)
    node_settings = dataclasses.replace(settings, node=dataclasses.replace(
        settings.node, scheduler="fcfs-min", malleable_resize=True, malleable_tick_s=0.2))
    node = CpuNode(node_settings, "ml-plain", 2, [0, 0], 1024.0, backend, registry)
    assert node.malleable is not None, "two units on one CPU: the node resizes too"
    node = CpuNode(node_settings, "ml-plain", 2, sorted(os.sched_getaffinity(0))[:2], 1024.0,
                   backend, registry)
    malleable = node.malleable
    assert malleable is not None
    node.start()
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            running = pool.submit(node.execute, malleable_run("p-run", work_waits=False).to_json(),
                                  time.time())
            log = wait_for(lambda: one(root, "run-log"), "the run's first test")
            wait_for(lambda: any(not t.grows for t in list(malleable.runs.values())),
                     "the node's try to grow the run")
            log.with_name("run-gate").touch()
            result = running.result(WAIT_S)
    finally:
        node.stop()
        shutil.rmtree(root, ignore_errors=True)
    assert result["status"] == "failed" and result["output"]["exit_code"] == 1
    assert "1 failed, 6 passed" in result["output"]["stdout"], result["output"]["stdout"]
    held = [r for r in registry.allocations("ml-plain") if r["action_id"] == result["action_id"]]
    assert len(held) <= 3, "one try to grow at most: admitted, reserved, given back"
    assert len(held[-1]["units"]) == 1
