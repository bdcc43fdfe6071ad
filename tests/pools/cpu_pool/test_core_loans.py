"""Core loans on real sandboxes and cgroups: a running action's cpuset shrinks while a short
action runs alone on the lent core, and a node lends instead of queueing the short action."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tangram_celery.pools.cpu_pool import CpuNode
from tangram_celery.pools.cpu_pool.worker import cpu_policy
from tangram_celery.pools.registry import Registry
from tangram_celery.sandbox import ExecSpec, SandboxLimits
from tangram_celery.sandbox.bwrap import BwrapBackend
from tangram_celery.settings import Settings

LIMITS = SandboxLimits(memory_mb=256, pids=64, file_size_mb=8, workdir_mb=32, tmp_mb=16,
                       nofile=128, output_cap_bytes=65536)

SAMPLE_AFFINITY = (
    "/usr/bin/python3 -c \"import os, time\n"
    "seen = []\n"
    "end = time.monotonic() + {seconds}\n"
    "while time.monotonic() < end:\n"
    "    now = sorted(os.sched_getaffinity(0))\n"
    "    if not seen or seen[-1] != now: seen.append(now)\n"
    "    time.sleep(0.005)\n"
    "print(seen)\""
)
"""A command that prints each distinct set of CPUs it may run on, over `seconds`."""


def affinity_sampler(seconds: float) -> str:
    return SAMPLE_AFFINITY.format(seconds=seconds)


@pytest.fixture()
def backend(two_cores: tuple[int, int]) -> Iterator[BwrapBackend]:
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap (bwrap) is not installed; apt-get install -y bubblewrap")
    root = Path("/var/tmp") / f"tangram-loan-test-{uuid.uuid4().hex[:10]}"
    sandbox = BwrapBackend(root, LIMITS)
    if sandbox.cgroups is None or "cpuset" not in sandbox.cgroups.controllers:
        sandbox.close()
        if os.geteuid() == 0:
            pytest.fail("no writable cgroup v1 cpuset controller although running as root: "
                        "mount the cpuset cgroup controller")
        pytest.skip("needs a writable cgroup v1 cpuset controller (run as root)")
    try:
        yield sandbox
    finally:
        sandbox.close()
        shutil.rmtree(root, ignore_errors=True)


def parse(stdout: str) -> list[list[int]]:
    value = json.loads(stdout.strip().splitlines()[-1])
    assert isinstance(value, list)
    return value


def test_repin_moves_a_running_action_off_the_lent_core(
    backend: BwrapBackend, two_cores: tuple[int, int]
) -> None:
    first, second = two_cores
    outcome: dict[str, Any] = {}

    def lender() -> None:
        outcome["lender"] = backend.run(ExecSpec("lender", affinity_sampler(2.0), {}, 30.0,
                                                 (first, second)))

    thread = threading.Thread(target=lender)
    thread.start()
    deadline = time.monotonic() + 10.0
    while not backend.repin("lender", (first, second), (first,)):
        assert time.monotonic() < deadline, "the lender's cpuset group never appeared"
        time.sleep(0.01)
    time.sleep(0.5)
    borrower = backend.run(ExecSpec("borrower", affinity_sampler(0.3), {}, 30.0, (second,)))
    assert backend.repin("lender", (first,), (first, second))
    thread.join(30.0)
    assert parse(borrower.stdout) == [[second]]
    seen = parse(outcome["lender"].stdout)
    assert seen[-2:] == [[first], [first, second]], seen
    assert not backend.repin("lender", (first, second), (first,)), "it has ended"
    assert not backend.repin("nobody", (first,), (second,))


def check_exclusive(records: list[dict[str, Any]]) -> None:
    """No unit is held by two actions at once, counting each loan as a hand-over: a lender
    does not hold what it has lent while the loan lasts."""
    pieces: list[tuple[str, set[int], float, float]] = []
    for record in records:
        parts = [(set(record["units"]), record["start"], record["end"])]
        for loan in record.get("lent", ()):
            split = []
            for units, start, end in parts:
                lent = units & set(loan["units"])
                if not lent or loan["end"] <= start or end <= loan["start"]:
                    split.append((units, start, end))
                    continue
                split.append((units - lent, max(start, loan["start"]), min(end, loan["end"])))
                if start < loan["start"]:
                    split.append((units, start, loan["start"]))
                if loan["end"] < end:
                    split.append((units, loan["end"], end))
            parts = split
        pieces += [(record["action_id"], units, start, end) for units, start, end in parts]
    for a, b in itertools.combinations(pieces, 2):
        if a[0] != b[0] and a[2] < b[3] and b[2] < a[3]:
            assert not a[1] & b[1], (a, b)


@pytest.mark.slow
def test_a_node_lends_a_core_of_a_running_test_run_to_a_short_action(
    settings: Settings, registry: Registry, backend: BwrapBackend, two_cores: tuple[int, int]
) -> None:
    """Two cores, both held by an elastic test run (idle node: the robust scheduler gives it
    both); a 0.2 s exec action arrives and starts at once on the lent core, alone, while the
    test run's cpuset shrinks to the other core and grows back after."""
    first, second = two_cores
    node = CpuNode(settings, "loan-node", 2, [first, second], 1024.0, backend, registry,
                   policy=cpu_policy(settings.node, [first, second]))
    tests = {"trajectory_id": "tests", "kind": "test_run", "cost": {"cpu": [1, 2]},
             "payload": {"cmd": affinity_sampler(3.0)}, "t1": 6.0,
             "elasticity": {"amdahl": 0.99}, "signature": "loan-tests"}
    short = {"trajectory_id": "exec", "kind": "exec", "cost": {"cpu": 1},
             "payload": {"cmd": affinity_sampler(0.2)}, "t1": 0.2, "signature": "loan-exec"}
    results: dict[str, dict[str, Any]] = {}
    thread = threading.Thread(target=lambda: results.update(
        tests=node.execute(tests, time.time())))
    thread.start()
    time.sleep(1.0)
    received = time.time()
    results["exec"] = node.execute(short, received)
    thread.join(30.0)
    node.stop()
    lender, borrower = results["tests"], results["exec"]
    assert lender["status"] == "ok" and borrower["status"] == "ok", (lender, borrower)
    assert lender["units"] == [0, 1] and borrower["units"] == [1]
    assert borrower["timings"]["admitted"] - received < 0.5, "it did not queue"
    assert parse(borrower["output"]["stdout"]) == [[second]]
    seen = parse(lender["output"]["stdout"])
    assert seen == [[first, second], [first], [first, second]], seen
    records = registry.allocations("loan-node")
    loans = [r for r in records if "lent_by" in r]
    assert [(r["action_id"], r["lent_by"], r["units"]) for r in loans] == [
        (borrower["action_id"], lender["action_id"], [1])]
    held = next(r for r in records if r["action_id"] == lender["action_id"])
    assert [loan["action_id"] for loan in held["lent"]] == [borrower["action_id"]]
    check_exclusive(records)


@pytest.mark.slow
def test_a_borrower_admitted_while_it_runs_moves_onto_its_own_core(
    settings: Settings, registry: Registry, backend: BwrapBackend, two_cores: tuple[int, int]
) -> None:
    """Four units on the two CPUs (units 0 and 2 on the first, 1 and 3 on the second): test
    runs a (3 s) and d (1 s) take two units each; a 2 s exec action arrives at t = 0.5 and
    borrows unit 1 from a (d ends before it would). When d ends, the gate admits the exec's
    request: it is re-pinned onto one of d's units and a has its unit back."""
    first, second = two_cores
    node = CpuNode(settings, "move-node", 4, [first, second], 1024.0, backend, registry,
                   policy=cpu_policy(settings.node, [first, second, first, second]))

    def elastic_run(trajectory: str, seconds: float) -> dict[str, Any]:
        return {"trajectory_id": trajectory, "kind": "test_run", "cost": {"cpu": [1, 2]},
                "payload": {"cmd": affinity_sampler(seconds)}, "t1": 2 * seconds,
                "elasticity": {"amdahl": 0.99}, "signature": f"move-{trajectory}"}

    short = {"trajectory_id": "exec", "kind": "exec", "cost": {"cpu": 1},
             "payload": {"cmd": affinity_sampler(2.0)}, "t1": 2.0, "signature": "move-exec"}
    results: dict[str, dict[str, Any]] = {}
    threads = [threading.Thread(target=lambda t=t, s=s: results.update(
        {t: node.execute(elastic_run(t, s), time.time())})) for t, s in (("a", 3.0), ("d", 1.0))]
    for thread in threads:
        thread.start()
        time.sleep(0.05)
    time.sleep(0.45)
    received = time.time()
    results["exec"] = node.execute(short, received)
    for thread in threads:
        thread.join(30.0)
    node.stop()
    a, d, borrower = results["a"], results["d"], results["exec"]
    assert all(r["status"] == "ok" for r in (a, d, borrower)), results
    assert sorted([a["units"], d["units"]]) == [[0, 1], [2, 3]]
    assert a["units"] == [0, 1], "the longer test run lends"
    assert borrower["units"] == [1] and borrower["timings"]["admitted"] - received < 0.5
    records = registry.allocations("move-node")
    own = [r for r in records if r["action_id"] == borrower["action_id"] and "lent_by" not in r]
    loan = [r for r in records if r.get("lent_by") == a["action_id"]]
    assert len(own) == 1 and own[0]["units"][0] in (2, 3) and len(loan) == 1
    assert loan[0]["end"] == pytest.approx(own[0]["start"], abs=0.05), "moved on admission"
    moved_to = (first, second)[own[0]["units"][0] % 2]
    seen = parse(borrower["output"]["stdout"])
    assert seen[0] == [second] and seen[-1] == [moved_to], seen
    assert parse(a["output"]["stdout"])[-2:] == [[first], [first, second]]
    check_exclusive(records)
