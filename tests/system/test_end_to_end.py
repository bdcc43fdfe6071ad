"""End to end on real parts: a real Redis, real `tangram worker cpu` processes, real sandboxes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from result_checks import check_act, check_exclusive

from tangram_celery import keys
from tangram_celery.action import ActionResult
from tangram_celery.client import TangramClient, code_action, command_action, test_run_action
from tangram_celery.errors import ValidationError
from tangram_celery.settings import Settings
from tangram_celery.tasks.ledger import Ledger

CpuWorkers = Callable[..., list[str]]

pytestmark = pytest.mark.slow

def test_fifty_actions_over_five_trajectories(settings: Settings,
                                              cpu_workers: CpuWorkers) -> None:
    nodes = cpu_workers({"e2e-a": 2, "e2e-b": 2})
    actions = [
        code_action(f"traj-{t}", f"import os\nprint({t} * 100 + {k}, os.environ['TANGRAM_UNITS'])")
        for t in range(5) for k in range(10)
    ]
    with TangramClient(settings) as client:
        results = client.run_batch(actions, timeout=120)
        for t in range(5):
            client.end_trajectory(f"traj-{t}")
    assert [r.action_id for r in results] == [a.id for a in actions]
    for action, result in zip(actions, results, strict=True):
        t, k = divmod(actions.index(action), 10)
        assert result.ok, (result.status, result.error, result.output)
        assert result.output["stdout"] == f"{t * 100 + k} 1\n"
        assert result.trajectory_id == f"traj-{t}" and result.node in nodes
        assert len(result.units) == 1
        check_act(result)
    by_traj = {r.trajectory_id: {x.node for x in results if x.trajectory_id == r.trajectory_id}
               for r in results}
    assert all(len(n) == 1 for n in by_traj.values()), "a trajectory stays on its node"
    assert {r.node for r in results} == set(nodes), "trajectories spread over both nodes"
    check_exclusive(results)


def test_environment_persists_in_order_and_is_freed(settings: Settings,
                                                    cpu_workers: CpuWorkers) -> None:
    cpu_workers({"env-a": 2})

    async def rollout(client: TangramClient, tid: str) -> list[ActionResult]:
        out = []
        for k in range(4):
            code = f"open('log.txt', 'a').write('{tid}:{k} ')\nprint(open('log.txt').read())"
            out.append(await client.submit(code_action(tid, code)))
        return out

    async def main(client: TangramClient) -> list[list[ActionResult]]:
        return list(await asyncio.gather(*(rollout(client, f"p{i}") for i in range(3))))

    with TangramClient(settings) as client:
        batches = asyncio.run(main(client))
        for i, batch in enumerate(batches):
            assert batch[-1].output["stdout"].split() == [f"p{i}:{k}" for k in range(4)]
            client.end_trajectory(f"p{i}")
        deadline = time.monotonic() + 10
        node_root = Path(settings.sandbox.root) / "env-a"
        while time.monotonic() < deadline and any(node_root.glob("*/*")):
            time.sleep(0.1)
        again = client.submit(code_action("p0", "import os\nprint(os.path.exists('log.txt'))"))
        assert again.result(30).output["stdout"] == "False\n", "end_trajectory removed the env"
        client.end_trajectory("p0")


def test_a_confirmed_end_gives_the_next_action_a_fresh_environment(
        settings: Settings, cpu_workers: CpuWorkers) -> None:
    cpu_workers({"end-a": 2})
    probe = "import os\nprint(os.path.exists('mark.txt'))\nopen('mark.txt', 'w').write('x')"
    with TangramClient(settings) as client:
        seen = []
        for _ in range(5):
            seen.append(client.submit(code_action("again", probe)).result(30).output["stdout"])
            assert client.end_trajectory("again", wait_s=30)
        assert seen == ["False\n"] * 5, "each action after a confirmed end starts afresh"
        assert client.end_trajectory("never-placed", wait_s=30), "nothing to end is confirmed"


def test_elastic_test_run_gets_pytest_n(settings: Settings, cpu_workers: CpuWorkers) -> None:
    cpu_workers({"tr-a": 2})
    tests = "".join(f"def test_{i}():\n    assert {i} >= 0\n" for i in range(6))
    with TangramClient(settings) as client:
        result = client.submit(test_run_action(
            "tr", "python3 -m pytest -q -p no:cacheprovider test_x.py", cpu=2,
            files={"test_x.py": tests},
        )).result(120)
        client.end_trajectory("tr")
    assert result.ok, result.output
    assert "6 passed" in result.output["stdout"]
    assert len(result.units) == 2 and "bringing up nodes" in result.output["stdout"]


def test_bad_messages_are_answered_and_the_worker_survives(
    settings: Settings, cpu_workers: CpuWorkers, redis_client: redis.Redis
) -> None:
    cpu_workers({"bad-a": 1})
    with TangramClient(settings) as client:
        with pytest.raises(ValidationError, match=r"cost\.cpu"):
            client.submit(command_action("x", "true", cpu=(4, 2)))
        raw = client.app.send_task(keys.task_name("exec"), args=[{"kind": "exec", "cost": "x"}],
                                   queue=keys.cpu_queue("bad-a"), task_id="raw-bad-1")
        stored = raw.get(timeout=30)
        assert stored["status"] == "rejected" and "invalid action" in stored["error"]
        client.app.send_task(keys.task_name("exec"), args=[{"x": 1}], serializer="pickle",
                             queue=keys.cpu_queue("bad-a"))
        after = client.submit(command_action("x", "echo alive")).result(30)
        client.end_trajectory("x")
        letters = Ledger(redis_client, 60).dead_letters()
    assert after.output["stdout"] == "alive\n"
    assert len(letters) == 1 and "pickle" in letters[0]["reason"]
    assert letters[0]["queue"] == keys.cpu_queue("bad-a")


def test_a_redelivered_action_returns_its_stored_result(
    settings: Settings, cpu_workers: CpuWorkers
) -> None:
    cpu_workers({"idem-a": 1})
    code = "open('n', 'a').write('x')\nprint(len(open('n').read()))"
    with TangramClient(settings) as client:
        first = client.submit(code_action("i", code, id="fixed-id-1")).result(30)
        again = client.submit(code_action("i", code, id="fixed-id-1")).result(30)
        probe = client.submit(code_action("i", "print(len(open('n').read()))")).result(30)
        client.end_trajectory("i")
    assert first.output["stdout"] == again.output["stdout"] == "1\n"
    assert probe.output["stdout"] == "1\n", "the second delivery did not run again"
    assert first.attempts == again.attempts == 1


def test_failures_and_timeouts_are_results(settings: Settings, cpu_workers: CpuWorkers) -> None:
    cpu_workers({"fail-a": 2})
    with TangramClient(settings) as client:
        failed = client.submit(command_action("f", "echo oops >&2; exit 3")).result(30)
        slow = client.submit(command_action("f", "sleep 30", timeout_s=1)).result(30)
        client.end_trajectory("f")
    assert failed.status == "failed" and failed.output["exit_code"] == 3
    assert failed.output["stderr"] == "oops\n"
    assert slow.status == "timeout" and slow.output["timed_out"]
    assert slow.act["exec"] < 5
