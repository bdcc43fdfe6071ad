"""A minimal GRPO-style training step whose rollouts call tools through tangram.

For each prompt, a *group* of rollouts is sampled from a stub policy that emits Python code and
shell tool calls (each one a tangram action on a CPU node), then a final unit-test run whose
outcome is the reward. All rollouts of the step run concurrently with asyncio; the LLM's think
time between tool calls is simulated. The step ends with group-normalised advantages, as GRPO
computes them, and prints the step time and the ACT of every action kind.

Run it against a running cluster (``TANGRAM_REDIS_URL`` with live CPU nodes), or on its own: when
no CPU node is registered it starts a local one like ``tangram demo`` does::

    python examples/grpo_step.py --prompts 2 --group 4 --turns 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

from tangram_celery.action import Action, ActionResult
from tangram_celery.client import TangramClient, code_action, command_action, test_run_action
from tangram_celery.stack.demo import DemoConfig, local_cluster
from tangram_celery.pools.registry import Registry
from tangram_celery.observe.report import act_table, summarize
from tangram_celery.settings import Settings

TESTS = "\n".join(
    f"def test_square_{k}():\n    from solution import square\n    assert square({k}) == {k * k}\n"
    for k in range(6)
)


@dataclass
class Rollout:
    """One sampled trajectory: its tool results and its reward."""

    trajectory_id: str
    results: list[ActionResult]
    reward: float = 0.0


class StubPolicy:
    """Stands in for the LLM: emits tool calls, then a solution that is right or wrong."""

    def __init__(self, seed: int, think_s: float) -> None:
        self.rng = random.Random(seed)
        self.think_s = think_s

    async def think(self) -> None:
        """The time a real model would spend generating the next turn."""
        await asyncio.sleep(self.rng.uniform(0.0, self.think_s))

    def tool_call(self, trajectory_id: str, turn: int) -> Action:
        """A Python snippet or a shell command, as an agent would emit while exploring."""
        if self.rng.random() < 0.5:
            n = self.rng.randint(10, 10_000)
            return code_action(trajectory_id, f"print(sum(i * i for i in range({n})))",
                               signature="probe-code")
        return command_action(trajectory_id, f"echo turn {turn}; ls -1 | head -5",
                              signature="probe-shell")

    def solution(self, trajectory_id: str) -> Action:
        """Write the final answer; about one rollout in three is wrong."""
        body = "x * x" if self.rng.random() > 0.33 else "x * 2"
        files = {"solution.py": f"def square(x):\n    return {body}\n", "test_solution.py": TESTS}
        return code_action(trajectory_id, "print('answer written')", files=files)


async def rollout(client: TangramClient, policy: StubPolicy, trajectory_id: str,
                  turns: int) -> Rollout:
    """Sample one trajectory: tool calls, an answer, and its reward from the unit tests."""
    results = []
    for turn in range(turns):
        await policy.think()
        results.append(await client.submit(policy.tool_call(trajectory_id, turn)))
    await policy.think()
    results.append(await client.submit(policy.solution(trajectory_id)))
    tests = test_run_action(trajectory_id, "python3 -m pytest -q -p no:cacheprovider",
                            cpu=(1, 2), elasticity={"amdahl": 0.7}, signature="grpo-tests")
    verdict = await client.submit(tests)
    results.append(verdict)
    client.end_trajectory(trajectory_id)
    return Rollout(trajectory_id, results, reward=1.0 if verdict.ok else 0.0)


def advantages(group: list[Rollout]) -> list[float]:
    """GRPO's advantage: each reward normalised by its group's mean and deviation."""
    rewards = [r.reward for r in group]
    mean, spread = statistics.fmean(rewards), statistics.pstdev(rewards)
    return [(r - mean) / (spread + 1e-6) for r in rewards]


async def grpo_step(client: TangramClient, step: int, prompts: int, group: int, turns: int,
                    think_s: float) -> list[list[Rollout]]:
    """Every rollout of one step, concurrently, grouped by prompt."""
    stamp = int(time.time() * 1000)

    async def one_group(prompt: int) -> list[Rollout]:
        return list(await asyncio.gather(*(
            rollout(client, StubPolicy(hash((step, prompt, g)), think_s),
                    f"grpo-{stamp}-s{step}-p{prompt}-g{g}", turns)
            for g in range(group)
        )))

    return list(await asyncio.gather(*(one_group(p) for p in range(prompts))))


@contextlib.contextmanager
def cluster(settings: Settings, nodes: int, cores: int) -> Iterator[Settings]:
    """The configured cluster when a CPU node is alive there, else a local one."""
    client = redis.Redis.from_url(settings.broker.redis_url, socket_connect_timeout=0.5)
    try:
        live = [n for n in Registry(client, settings.node.ttl_s, 60).nodes() if n.alive]
    except redis.RedisError:
        live = []
    finally:
        client.close()
    if live:
        print(f"using {len(live)} live CPU node(s) at {settings.broker.redis_url.split('@')[-1]}")
        yield settings
        return
    with tempfile.TemporaryDirectory(prefix="tangram-grpo-") as logs:
        print(f"no live CPU node: starting {nodes} local node(s) x {cores} cores (logs in {logs})")
        config = DemoConfig(nodes=nodes, cores_per_node=cores)
        with local_cluster(settings, config, Path(logs)) as live_settings:
            yield live_settings


def main() -> int:
    """Run the steps and print what a trainer would log."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--group", type=int, default=4, help="rollouts per prompt")
    parser.add_argument("--turns", type=int, default=3, help="tool calls before the answer")
    parser.add_argument("--think-s", type=float, default=0.05, help="simulated LLM think time")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--cores", type=int, default=2)
    args = parser.parse_args()
    with cluster(Settings.from_env(), args.nodes, args.cores) as settings, \
            TangramClient(settings) as client:
        for step in range(args.steps):
            started = time.perf_counter()
            groups = asyncio.run(grpo_step(client, step, args.prompts, args.group, args.turns,
                                           args.think_s))
            elapsed = time.perf_counter() - started
            rollouts = [r for g in groups for r in g]
            mean_reward = statistics.fmean(r.reward for r in rollouts)
            spread = max(max(advantages(g)) - min(advantages(g)) for g in groups)
            print(act_table(summarize([x for r in rollouts for x in r.results])))
            print(f"step {step}: {len(rollouts)} rollouts, "
                  f"{sum(len(r.results) for r in rollouts)} actions, mean reward "
                  f"{mean_reward:.2f}, widest advantage spread {spread:.2f}, "
                  f"step time {elapsed:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
