"""GPU pools learn service times per (model, DoP) from the calls they served and share them
through Redis (real Redis, real runtimes and duration logs).

**This machine has no GPU**: the pools' executor is a stand-in that takes each call's time on
a chunk from Amdahl's law instead of running it on GPUs (the repository's real model specs).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pytest
import redis
from test_gpu_pool import FakeExecutor, message

from tangram_celery import keys
from tangram_celery.action import ActionResult, parse_action
from tangram_celery.pools.duration_sharing import SharedDurations
from tangram_celery.pools.gpu_pool import GpuPoolRuntime
from tangram_celery.reward.executor import RewardOutcome
from tangram_celery.scheduling import DurationModel
from tangram_celery.settings import Settings

T1, P = 4.0, 0.9
ELASTIC = {"gpu": {"set": [1, 2, 4, 8]}}


def amdahl(m: int) -> float:
    return T1 * ((1 - P) + P / m)


class AmdahlExecutor(FakeExecutor):
    """The stand-in for the GPUs (none here): a call of answer_match on ``k`` GPUs reports
    Amdahl's time for ``k``, and restores nothing."""

    def run(self, model: str, inputs: Mapping[str, Any], gpus: tuple[int, ...]) -> RewardOutcome:
        self.runs.append((model, gpus))
        now = time.time()
        return RewardOutcome({"reward": 1.0}, exec_s=amdahl(len(gpus)), setup_s=0.0,
                             loaded=False, evicted=[], triton_model=f"{model}@{gpus}",
                             started_at=now, finished_at=now)


def pool(client: redis.Redis, name: str, every_s: float = 0.05,
         scheduler: str = "elastic") -> GpuPoolRuntime:
    shared = SharedDurations(client, name, DurationModel(), every_s, pools=keys.GPU)
    shared.catch_up()
    return GpuPoolRuntime(Settings.from_env({}, scheduler=scheduler), name, AmdahlExecutor(),
                          range(8), 8, name=name, shared=shared)


def serve(runtime: GpuPoolRuntime, cost: dict[str, Any]) -> ActionResult:
    return ActionResult.from_json(runtime.execute(message(cost=cost), time.time()))


def options(runtime: GpuPoolRuntime) -> dict[int, float | None]:
    call = parse_action(message(cost=ELASTIC, elasticity="linear"))
    assert call.t1 is None
    return dict(runtime.request(call, "answer_match", (1, 2, 4, 8), 0.0).options)


def test_what_one_pool_served_reaches_another_and_prices_a_call_without_t1(
        redis_client: redis.Redis) -> None:
    a, b = pool(redis_client, "a"), pool(redis_client, "b")
    b.start()
    try:
        assert options(b) == pytest.approx({1: 10.0, 2: 7.5, 4: 6.25, 8: 5.625}), "the prior"
        for cost in ({"gpu": 1}, {"gpu": 8}):
            assert serve(a, cost).status == "ok"
        deadline = time.monotonic() + 10
        while b.durations.observed(("reward", "answer_match")) != (1, 8):
            assert time.monotonic() < deadline, "pool b never read what pool a served"
            time.sleep(0.02)
        learned = options(b)
        for m in (1, 2, 4, 8):
            assert learned[m] == pytest.approx(amdahl(m), rel=0.03), m
    finally:
        b.stop()
    assert redis_client.xlen(keys.duration_log(keys.GPU)) == 2
    assert not redis_client.exists(keys.duration_log()), "the CPU nodes' log is left alone"


def test_a_pool_that_starts_later_reads_the_history_and_scales_the_call(
        redis_client: redis.Redis) -> None:
    first = pool(redis_client, "first")
    for cost in ({"gpu": 1}, {"gpu": 2}, {"gpu": 8}):
        serve(first, cost)
    late = pool(redis_client, "late")
    assert late.durations.observed(("reward", "answer_match")) == (1, 2, 8)
    assert options(late)[8] == pytest.approx(amdahl(8), rel=0.03)
    body = message(cost=ELASTIC, elasticity="linear")
    result = ActionResult.from_json(late.execute(body, time.time()))
    assert result.status == "ok" and len(result.units) > 1, "an idle pool scales the call up"


def test_a_pool_learns_alone_without_a_shared_log() -> None:
    runtime = GpuPoolRuntime(Settings.from_env({}, scheduler="elastic"), "alone",
                             AmdahlExecutor(), range(8), 8, name="alone")
    for cost in ({"gpu": 1}, {"gpu": 4}):
        serve(runtime, cost)
    assert options(runtime)[2] == pytest.approx(amdahl(2), rel=0.03)
