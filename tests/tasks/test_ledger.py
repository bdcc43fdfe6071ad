"""The ledger on a real Redis: one stored result per action, and claims, so that a second copy
of a message (as a failover can hand out) waits for the first one's result instead of running
beside it."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import redis

from tangram_celery import keys
from tangram_celery.settings import Settings
from tangram_celery.tasks.app import attach_runtime, execute_once, make_app
from tangram_celery.tasks.ledger import Ledger


class SlowRuntime:
    """Counts the runs of each action; each run takes ``run_s``."""

    def __init__(self, run_s: float) -> None:
        self.run_s = run_s
        self.runs: list[str] = []

    def execute(self, message: dict[str, Any], received: float) -> dict[str, Any]:
        self.runs.append(message["id"])
        time.sleep(self.run_s)
        return {"action_id": message["id"], "status": "ok", "timings": {}, "output": {
            "run": len(self.runs)}}

    def end_trajectory(self, trajectory_id: str) -> None:
        """Nothing to end."""


def test_a_claim_is_taken_once_per_delivery_and_again_by_the_same_one(
        redis_client: redis.Redis) -> None:
    ledger = Ledger(redis_client, 60, claim_s=30)
    action = f"claim-{uuid.uuid4().hex[:8]}"
    first = ledger.begin(action, "token-a")
    assert first.attempt == 1 and first.stored is None and not first.holder
    assert ledger.begin(action, "token-a").attempt == 1, "a retried claim is the same start"
    assert ledger.begin(action, "token-b").holder == "token-a"
    ledger.store(action, {"status": "ok"})
    assert ledger.begin(action, "token-b").stored == {"status": "ok"}
    assert int(redis_client.get(keys.action_attempts(action)) or 0) == 1


def test_a_second_copy_of_a_running_action_waits_for_its_result(
        redis_client: redis.Redis, settings: Settings) -> None:
    app = make_app(settings)
    runtime = SlowRuntime(run_s=1.5)
    attach_runtime(app, runtime, Ledger(redis_client, 60, claim_s=30))
    action = f"dup-{uuid.uuid4().hex[:8]}"
    answers: list[dict[str, Any]] = []
    copies = [threading.Thread(target=lambda: answers.append(
        execute_once(app, {"id": action}, time.time()))) for _ in range(2)]
    for copy in copies:
        copy.start()
        time.sleep(0.2)
    for copy in copies:
        copy.join(30)
    assert runtime.runs == [action], "the second copy ran beside the first"
    assert len(answers) == 2 and answers[0]["output"] == answers[1]["output"] == {"run": 1}
