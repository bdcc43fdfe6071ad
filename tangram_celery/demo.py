"""``tangram demo``: a small agentic-coding batch on this machine, with its ACT table.

It uses the Redis at ``TANGRAM_REDIS_URL`` if one answers, else an embedded one; starts its own
CPU node workers; runs a few trajectories (several code actions each, then an elastic test run)
concurrently as asyncio rollouts; prints the ACT parts per kind; and stops what it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import redis

from tangram_celery.action import Action, ActionResult
from tangram_celery.client import TangramClient, code_action, test_run_action
from tangram_celery.registry import Registry
from tangram_celery.report import act_table, summarize
from tangram_celery.services import ensure_redis, spawn_cpu_worker, stop_process, wait_for_nodes
from tangram_celery.settings import Settings

SOLUTION = '''\
def add(a, b):
    return a + b


def fib(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a
'''


@dataclass(frozen=True)
class DemoConfig:
    """Size of the demo batch and of the local cluster it starts."""

    trajectories: int = 4
    code_actions: int = 3
    nodes: int = 2
    cores_per_node: int = 2
    think_s: float = 0.05
    seed: int = 7


def trajectory_actions(trajectory_id: str, index: int, config: DemoConfig) -> list[Action]:
    """The actions of one agentic-coding trajectory: write code, probe it, write tests, test."""
    probes = [f"from solution import fib\nprint(fib({10 + index + k}))"
              for k in range(max(config.code_actions - 2, 0))]
    tests = "\n".join(
        f"def test_fib_{k}():\n    from solution import fib\n    assert fib({k}) >= 0\n"
        for k in range(8)
    )
    code = [
        code_action(trajectory_id, f"open('solution.py', 'w').write({SOLUTION!r})\nprint('ok')"),
        *(code_action(trajectory_id, probe) for probe in probes),
        code_action(trajectory_id, f"open('test_solution.py', 'w').write({tests!r})\n"
                                   "print('tests written')"),
    ]
    final = test_run_action(
        trajectory_id, "python3 -m pytest -q -p no:cacheprovider test_solution.py",
        cpu=(1, 2), elasticity={"amdahl": 0.8}, t1=1.0, signature="demo-tests",
    )
    return [*code[: config.code_actions], final]


async def rollout(
    client: TangramClient, trajectory_id: str, index: int, config: DemoConfig, rng: random.Random
) -> list[ActionResult]:
    """One trajectory: each action waits for the previous one, with LLM think time between."""
    results = []
    for action in trajectory_actions(trajectory_id, index, config):
        await asyncio.sleep(rng.uniform(0, config.think_s))
        results.append(await client.submit(action))
    client.end_trajectory(trajectory_id)
    return results


async def run_batch(client: TangramClient, config: DemoConfig) -> list[list[ActionResult]]:
    """Run every trajectory of the demo concurrently."""
    rng = random.Random(config.seed)
    prefix = f"demo-{int(time.time())}"
    return list(await asyncio.gather(*(
        rollout(client, f"{prefix}-{i}", i, config, random.Random(rng.random()))
        for i in range(config.trajectories)
    )))


@contextlib.contextmanager
def local_cluster(
    settings: Settings, config: DemoConfig, log_dir: Path, extra_env: Mapping[str, str] = {},
) -> Iterator[Settings]:
    """Redis (existing or embedded) and ``config.nodes`` CPU node workers; stops what it started.

    ``extra_env`` adds ``TANGRAM_`` settings for the workers only (e.g. their scheduler).
    """
    with ensure_redis(settings.redis_url) as url:
        settings = settings.with_(redis_url=url, result_url="")
        env = {"TANGRAM_REDIS_URL": url, "TANGRAM_SANDBOX_ROOT": str(settings.sandbox_root),
               **extra_env}
        names = [f"demo-node-{i}" for i in range(config.nodes)]
        workers = [spawn_cpu_worker(env, name, config.cores_per_node, log_dir / f"{name}.log")
                   for name in names]
        try:
            client = redis.Redis.from_url(url)
            wait_for_nodes(Registry(client, settings.node_ttl_s, settings.trajectory_ttl_s),
                           names)
            client.close()
            yield settings
        finally:
            for worker in workers:
                stop_process(worker)


def main(settings: Settings, config: DemoConfig) -> int:
    """Run the demo and print its ACT table; returns a process exit code."""
    with tempfile.TemporaryDirectory(prefix="tangram-demo-") as logs:
        print(f"tangram demo: {config.trajectories} trajectories x "
              f"({config.code_actions} code actions + 1 test run), {config.nodes} nodes x "
              f"{config.cores_per_node} cores; worker logs in {logs}", flush=True)
        with local_cluster(settings, config, Path(logs)) as live:
            print(f"redis: {live.redis_url.split('@')[-1]}", flush=True)
            with TangramClient(live) as client:
                started = time.time()
                batches = asyncio.run(run_batch(client, config))
                elapsed = time.time() - started
        results = [r for batch in batches for r in batch]
        print(act_table(summarize(results)))
        passed = sum(batch[-1].ok for batch in batches)
        print(f"{len(results)} actions in {elapsed:.2f} s; test runs passed: "
              f"{passed}/{len(batches)}")
        failed = [r for r in results if not r.ok]
        for result in failed[:5]:
            print(f"  {result.action_id} {result.kind} {result.status}: {result.error} "
                  f"{result.output.get('stderr', '')[-300:]}")
        return 0 if not failed else 1
