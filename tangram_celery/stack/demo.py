"""``tangram demo``: a small agentic-coding batch on the local stack, with its ACT table.

It brings up the services of ``compose/docker-compose.yml`` that the batch needs with the
machinery of ``tangram up`` (:func:`tangram_celery.stack.up.local_stack`, commands read from the
compose file): ``redis`` (the embedded ``redis-server``), ``triton`` (the pytriton
``tritonserver`` binary on ``triton_models/``), one copy of ``cpu-node`` per ``--nodes`` (the
same command with ``STACK_CPU_NODE=demo-node-<i>`` and ``STACK_CPU_CORES=--cores``) and
``gpu-pool`` (simulated GPU ids on a machine without GPUs). Flower is not started: nothing could
look at it before the demo stops it. The stack listens on free loopback ports and keeps its
state (logs, AOF, generated passwords) in a temporary directory, so the demo runs beside a
``tangram up`` or another demo; the directory is removed after a clean run and kept (its path
printed) after a failure.

Each trajectory runs several code actions, then an elastic test run on its CPU node, then a
reward action on the GPU pool: ``answer_match`` scores the number of tests that passed against
the number written. Trajectories run concurrently as asyncio rollouts; the ACT parts are printed
per kind (``exec``, ``test_run``, ``reward``), and everything started is stopped, on Ctrl-C and
SIGTERM too.

Redis: the demo always uses the stack's own. ``TANGRAM_REDIS_URL``, ``TANGRAM_RESULT_URL`` and
``TANGRAM_TRITON_URL`` are not used (a note says so when that Redis answers): the client pins a
trajectory to any live CPU node registered in its Redis, so on a shared Redis the demo's actions
could run on other people's workers and its ACT would measure them. Other ``TANGRAM_`` settings
(and ``compose/.env``) reach the services as they do under ``tangram up``.

:func:`local_cluster` (Redis and CPU node workers without Triton, for the benchmarks) is the
previous, lighter way; it is kept as it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import redis

from tangram_celery import keys
from tangram_celery.action import Action, ActionResult
from tangram_celery.client import TangramClient, code_action, test_run_action
from tangram_celery.connection import connect
from tangram_celery.errors import ServiceError
from tangram_celery.keys import DEFAULT_GPU_POOL
from tangram_celery.observe.report import act_table, summarize
from tangram_celery.pools.gpu_pool import reward_action
from tangram_celery.pools.inventory import gpu_pool_view
from tangram_celery.pools.launch import spawn_cpu_worker, wait_for_nodes
from tangram_celery.pools.registry import Registry
from tangram_celery.processes import stop_process
from tangram_celery.settings import Settings
from tangram_celery.stack.broker import ensure_redis, redis_answers
from tangram_celery.stack.plan import CLIENT_SETTINGS, UpOptions, client_settings
from tangram_celery.stack.supervisor import watching
from tangram_celery.stack.up import local_stack

SOLUTION = '''\
def add(a, b):
    return a + b


def fib(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a
'''
TESTS = 8
CPU_NODE_SERVICE = "cpu-node"
GPU_POOL_SERVICE = "gpu-pool"
NODE_VARIABLE = "STACK_CPU_NODE"  # the cpu-node service's --node in the compose file
CORES_VARIABLE = "STACK_CPU_CORES"  # its --cores
READY_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class DemoConfig:
    """Size of the demo batch and of the local cluster it starts."""

    trajectories: int = 4
    code_actions: int = 3
    nodes: int = 2
    cores_per_node: int = 2
    think_s: float = 0.05
    seed: int = 7
    reward_model: str = "answer_match"
    timeout_s: float = 600.0

    @property
    def node_names(self) -> list[str]:
        """The names of the demo's CPU nodes."""
        return [f"demo-node-{i}" for i in range(self.nodes)]


def trajectory_actions(trajectory_id: str, index: int, config: DemoConfig) -> list[Action]:
    """The actions of one agentic-coding trajectory: write code, probe it, write tests, test."""
    probes = [f"from solution import fib\nprint(fib({10 + index + k}))"
              for k in range(max(config.code_actions - 2, 0))]
    tests = "\n".join(
        f"def test_fib_{k}():\n    from solution import fib\n    assert fib({k}) >= 0\n"
        for k in range(TESTS)
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


def reward_for(trajectory_id: str, test_run: ActionResult, config: DemoConfig) -> Action:
    """The trajectory's reward action: the number of tests that passed, scored against the
    number written by ``config.reward_model`` on the GPU pool."""
    found = re.search(r"(\d+) passed", str(test_run.output.get("stdout", "")))
    passed = found.group(1) if found and test_run.ok else "0"
    return reward_action(trajectory_id, config.reward_model,
                         {"response": f"#### {passed}", "reference": str(TESTS)})


async def rollout(
    client: TangramClient, trajectory_id: str, index: int, config: DemoConfig, rng: random.Random
) -> list[ActionResult]:
    """One trajectory: each action waits for the previous one, with LLM think time between;
    the last one is the reward of the test run."""
    results = []
    for action in trajectory_actions(trajectory_id, index, config):
        await asyncio.sleep(rng.uniform(0, config.think_s))
        results.append(await client.submit(action))
    results.append(await client.submit(reward_for(trajectory_id, results[-1], config)))
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
    with ensure_redis(settings.broker.redis_url) as url:
        settings = settings.with_(redis_url=url, result_url="")
        env = {"TANGRAM_REDIS_URL": url, "TANGRAM_SANDBOX_ROOT": str(settings.sandbox.root),
               **extra_env}
        names = [f"demo-node-{i}" for i in range(config.nodes)]
        workers = [spawn_cpu_worker(env, name, config.cores_per_node, log_dir / f"{name}.log")
                   for name in names]
        try:
            client = connect(settings.broker, url)
            wait_for_nodes(Registry(client, settings.node.ttl_s, settings.actions.trajectory_ttl_s),
                           names)
            client.close()
            yield settings
        finally:
            for worker in workers:
                stop_process(worker)


def stack_options(config: DemoConfig, state_dir: Path, settings: Settings) -> UpOptions:
    """The ``tangram up`` options of the demo's stack: the CPU node copies and the GPU pool
    (with Redis and Triton, their dependencies) on free ports in ``state_dir``."""
    copies = tuple({NODE_VARIABLE: name, CORES_VARIABLE: str(config.cores_per_node)}
                   for name in config.node_names)
    return UpOptions(state_dir=state_dir, services=(CPU_NODE_SERVICE, GPU_POOL_SERVICE),
                     sandbox=settings.sandbox.backend, publish=False,
                     replicas={CPU_NODE_SERVICE: copies})


def stack_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The demo's environment for the stack: ours without the client addresses (the stack
    sets its own)."""
    return {k: v for k, v in environ.items() if k not in CLIENT_SETTINGS}


def wait_for_gpu_pool(client: redis.Redis, settings: Settings, pool: str,
                      timeout: float = READY_TIMEOUT_S) -> None:
    """Block until GPU pool ``pool`` has published itself and is alive."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        raw = client.hgetall(keys.gpu_pool(pool))
        if raw and gpu_pool_view(pool, raw, time.time(), settings.node.ttl_s).alive:
            return
        time.sleep(0.1)
    raise ServiceError(f"GPU pool {pool!r} did not come up within {timeout:.0f} s; see the "
                       f"{GPU_POOL_SERVICE} log")


def wait_until_serving(settings: Settings, config: DemoConfig) -> None:
    """Block until every CPU node and the GPU pool of the demo serve their queues."""
    client = connect(settings.broker)
    try:
        wait_for_nodes(Registry(client, settings.node.ttl_s, settings.actions.trajectory_ttl_s),
                       config.node_names, timeout=READY_TIMEOUT_S)
        wait_for_gpu_pool(client, settings, DEFAULT_GPU_POOL)
    finally:
        client.close()


def run_on_stack(settings: Settings, config: DemoConfig, state_dir: Path
                 ) -> tuple[list[list[ActionResult]], float]:
    """Bring the demo's stack up, run the batch on it, stop the stack: (results per
    trajectory, seconds the batch took)."""
    announce = _printer("  ")
    stop = threading.Event()
    options = stack_options(config, state_dir, settings)
    with local_stack(options, stack_environment(os.environ), announce, stop) as stack, \
            watching(stack, stop):
        found = client_settings(stack.services)
        live = settings.with_(redis_url=found["TANGRAM_REDIS_URL"], result_url="",
                              triton_url=found["TANGRAM_TRITON_URL"])
        wait_until_serving(live, config)
        print(f"stack ready; redis {live.broker.redis_url.split('@')[-1]}, triton "
              f"{live.triton.url}", flush=True)
        with TangramClient(live) as client:
            started = time.monotonic()
            try:
                batches = asyncio.run(asyncio.wait_for(run_batch(client, config),
                                                       config.timeout_s))
            except TimeoutError:
                raise ServiceError(f"the demo's batch did not finish within "
                                   f"{config.timeout_s:.0f} s (--timeout); see the service "
                                   f"logs in {state_dir / 'logs'}") from None
            return batches, time.monotonic() - started


def report(batches: Sequence[Sequence[ActionResult]], elapsed: float) -> int:
    """Print the ACT table and the outcome; 0 when every action succeeded."""
    results = [r for batch in batches for r in batch]
    print(act_table(summarize(results)))
    tests = sum(batch[-2].ok for batch in batches)
    rewards = [float(batch[-1].output.get("reward", 0.0)) for batch in batches]
    print(f"{len(results)} actions in {elapsed:.2f} s; test runs passed: {tests}/"
          f"{len(batches)}; mean reward {sum(rewards) / max(len(rewards), 1):.2f}")
    failed = [r for r in results if not r.ok]
    for result in failed[:5]:
        print(f"  {result.action_id} {result.kind} {result.status}: {result.error} "
              f"{str(result.output.get('stderr', ''))[-300:]}")
    return 0 if not failed else 1


def main(settings: Settings, config: DemoConfig) -> int:
    """Run the demo and print its ACT table; returns a process exit code."""
    if redis_answers(settings.broker.redis_url, timeout=0.2):
        print(f"note: the demo runs on its own Redis, not on TANGRAM_REDIS_URL "
              f"({settings.broker.redis_url.split('@')[-1]})", flush=True)
    state_dir = Path(tempfile.mkdtemp(prefix="tangram-demo-"))
    print(f"tangram demo: {config.trajectories} trajectories x ({config.code_actions} code "
          f"actions + 1 test run + 1 {config.reward_model} reward), {config.nodes} CPU nodes x "
          f"{config.cores_per_node} cores and a GPU pool; stack state and logs in {state_dir}",
          flush=True)
    started = time.monotonic()
    status = 1
    try:
        with _sigterm_interrupts():
            status = report(*run_on_stack(settings, config, state_dir))
    except KeyboardInterrupt:
        status = 130
    finally:
        print(f"tangram demo: {time.monotonic() - started:.1f} s from start to stop", flush=True)
        if status == 0:
            shutil.rmtree(state_dir, ignore_errors=True)
        else:
            print(f"tangram demo: logs kept in {state_dir / 'logs'}", flush=True)
    return status


def _printer(prefix: str) -> Callable[[str], None]:
    def announce(line: str) -> None:
        print("\n".join(prefix + part for part in line.splitlines()), flush=True)

    return announce


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """The first SIGTERM raises KeyboardInterrupt in the block, so it stops the stack as
    Ctrl-C does; later ones are ignored while it stops."""

    def interrupt(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
