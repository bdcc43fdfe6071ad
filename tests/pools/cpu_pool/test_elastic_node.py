"""CPU allocate-on-execution with the elastic scheduler in real node workers."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from test_core_loans import check_exclusive

from tangram_bench.emulation import amdahl_duration, emulated_exec, emulated_test_run
from tangram_celery.action import Action, parse_action
from tangram_celery.client import TangramClient, test_run_action
from tangram_celery.pools.conversion import request_for
from tangram_celery.pools.registry import Registry
from tangram_celery.scheduling import DurationModel
from tangram_celery.settings import Settings

CpuWorkers = Callable[..., list[str]]


def action(**fields: object) -> Action:
    body = {"trajectory_id": "t", "kind": "test_run", "payload": {"cmd": "pytest"},
            "cost": {"cpu": [1, 4]}, "signature": "repo-1", **fields}
    return parse_action(body)


REQUESTS = [
    ("declared t1 and elasticity", {"t1": 4.0, "elasticity": "linear"},
     ((1, 4.0), (2, 2.0), (3, 4 / 3), (4, 1.0))),
    ("no elasticity: minimum only", {"t1": 4.0}, ((1, 4.0),)),
    ("nothing known", {"elasticity": "linear"}, ((1, None), (2, None), (3, None), (4, None))),
]


@pytest.mark.parametrize(("name", "fields", "options"), REQUESTS, ids=[r[0] for r in REQUESTS])
def test_request_options(name: str, fields: dict[str, object],
                         options: tuple[tuple[int, float | None], ...]) -> None:
    request = request_for(action(**fields), 0.0)
    assert [m for m, _ in request.options] == [m for m, _ in options]
    for (_, got), (_, want) in zip(request.options, options, strict=True):
        assert got == (None if want is None else pytest.approx(want))


def test_request_options_learned_online() -> None:
    model = DurationModel()
    for units, seconds in [(1, 8.0), (2, 4.2), (4, 2.3)] * 5:
        model.observe(("test_run", "repo-1"), units, seconds)
    request = request_for(action(elasticity="linear"), 0.0, model)
    durations = dict(request.options)
    assert durations[1] == pytest.approx(8.0, rel=0.2)
    assert durations[4] == pytest.approx(2.3, rel=0.3)


def check_audit(registry: Registry, node: str, cores: int) -> int:
    """The node's allocations never share a unit (a core lent to a short action is the
    borrower's, not the lender's, while the loan lasts); returns how many actions held units."""
    records = registry.allocations(node)
    for record in records:
        assert 1 <= len(record["units"]) <= cores and max(record["units"]) < cores
        assert record["end"] >= record["start"]
    check_exclusive(records)
    return len({record["action_id"] for record in records})


@pytest.mark.slow
def test_elastic_actions_get_idle_cores_and_never_share(
    settings: Settings, cpu_workers: CpuWorkers, registry: Registry
) -> None:
    cpu_workers({"el-a": 4})
    with TangramClient(settings) as client:
        alone = client.submit(emulated_test_run("e0", 0.8, 0.9, 4)).result(60)
        mixed = client.run_batch(
            [emulated_test_run(f"e{i}", 0.6, 0.9, 4) for i in range(1, 4)]
            + [emulated_exec(f"x{i}", 0.1) for i in range(6)], timeout=120)
        for tid in ["e0", "e1", "e2", "e3", *(f"x{i}" for i in range(6))]:
            client.end_trajectory(tid)
    assert alone.ok and len(alone.units) == 4, "an idle node gives an elastic action every core"
    assert alone.act["exec"] == pytest.approx(amdahl_duration(0.8, 0.9, 4), abs=0.25)
    assert all(r.ok for r in mixed)
    assert all(len(r.units) == 1 for r in mixed[3:]), "inelastic actions get their minimum"
    assert check_audit(registry, "el-a", 4) == 10


@pytest.mark.slow
def test_fixed_minimum_policy_gives_one_core(
    settings: Settings, cpu_workers: CpuWorkers, registry: Registry
) -> None:
    cpu_workers({"fx-a": 4}, TANGRAM_SCHEDULER="fcfs-min")
    with TangramClient(settings) as client:
        result = client.submit(emulated_test_run("f0", 0.3, 0.9, 4)).result(60)
        client.end_trajectory("f0")
    assert result.ok and len(result.units) == 1
    assert check_audit(registry, "fx-a", 4) == 1


def test_a_node_tries_a_new_signature_at_several_counts() -> None:
    model = DurationModel()
    assert all(d is None for _, d in request_for(action(elasticity="linear"), 0.0,
                                                  model).options)
    fresh = request_for(action(elasticity="linear"), 0.0, model, prior=True)
    assert all(d is not None for _, d in fresh.options)
    assert fresh.options[0][1] > fresh.options[-1][1]
    inelastic = request_for(action(), 0.0, model, prior=True)
    assert inelastic.options == ((1, None),)


@pytest.mark.slow
def test_a_malleable_test_run_on_a_real_node(
    settings: Settings, cpu_workers: CpuWorkers, registry: Registry
) -> None:
    """A test-run action with ``malleable`` in its payload runs its pytest as a malleable run
    with one worker per core it is given: every test runs in a worker of the runner, and each
    waits until both workers have run one."""
    suite = ("import os, pathlib, sys, time, pytest\n"
             "PIDS = pathlib.Path('/work/pids')\n"
             "@pytest.mark.parametrize('i', range(6))\n"
             "def test_in_a_worker(i):\n"
             "    assert any(a.startswith('--malleable-connect') for a in sys.argv)\n"
             "    with PIDS.open('a') as f:\n"
             "        f.write(f'{os.getpid()}\\n')\n"
             "    deadline = time.monotonic() + 20\n"
             "    while len(set(PIDS.read_text().split())) < 2:\n"
             "        assert time.monotonic() < deadline, 'one worker only'\n"
             "        time.sleep(0.02)\n")
    cpu_workers({"ml-a": 2})
    with TangramClient(settings) as client:
        result = client.submit(test_run_action(
            "m0", "python3 -m pytest -q -p no:cacheprovider suite", cpu=(1, 2),
            elasticity="linear", t1=4.0, payload={"malleable": True,
                                          "files": {"suite/test_w.py": suite}})).result(120)
        client.end_trajectory("m0")
    assert result.ok, result.output
    assert "6 passed" in result.output["stdout"]
    assert len(result.units) == 2
