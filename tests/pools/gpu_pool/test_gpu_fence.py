"""A GPU pool cut off from Redis starts no reward call until it has published itself again, and
does not run one that was answered meanwhile. Its Triton is faked (FakeExecutor): the cut is in
the pool's fence, whose clock the test moves; the cut link itself is tested on a CPU node
(tests/system/test_fencing.py), whose fence is the same."""

from __future__ import annotations

import json
import threading
import time

import redis
from test_gpu_pool import fake_runtime, message

from tangram_celery import keys
from tangram_celery.errors import AlreadyAnswered
from tangram_celery.pools.fence import Fence
from tangram_celery.tasks.ledger import Ledger


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_fenced_pool_starts_nothing_until_it_publishes_itself_again(
        redis_client: redis.Redis) -> None:
    runtime, executor = fake_runtime(client=redis_client)
    clock = Clock()
    runtime.fence = Fence("GPU pool unit", 3.0, Ledger(redis_client, 60).stored,
                          clock=clock)
    clock.now += 4.0
    assert runtime.fence.closed
    answers: list[dict[str, object]] = []
    worker = threading.Thread(target=lambda: answers.append(
        runtime.execute(message(id="g-1"), time.time())))
    worker.start()
    worker.join(0.8)
    assert worker.is_alive() and executor.runs == [], "a reward call started while fenced"
    runtime._beat()  # the heartbeat thread's beat: it publishes the pool again
    worker.join(10)
    assert executor.runs and answers[0]["status"] == "ok"
    assert redis_client.hget(keys.gpu_pool("unit"), "worker") == b"w1"


def test_a_fenced_pool_returns_the_answer_stored_meanwhile(redis_client: redis.Redis) -> None:
    runtime, executor = fake_runtime(client=redis_client)
    clock = Clock()
    stored = {"action_id": "g-2", "status": "node_lost"}
    redis_client.set(keys.action_result("g-2"), json.dumps(stored))
    runtime.fence = Fence("GPU pool unit", 3.0, Ledger(redis_client, 60).stored,
                          clock=clock)
    clock.now += 4.0
    runtime.fence.check()
    beat = threading.Timer(0.3, runtime._beat)
    beat.start()
    try:
        runtime.execute(message(id="g-2"), time.time())
    except AlreadyAnswered as answered:
        assert answered.result == stored
    else:
        raise AssertionError("an action answered while the pool was fenced ran")
    finally:
        beat.join()
    assert executor.runs == []
    assert runtime.admission.free_count() == 8, "its GPUs were given back"
