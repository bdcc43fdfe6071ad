"""A real GRPO training step with ``trl.GRPOTrainer`` on CPU: a tiny locally built model, its
rewards from real test runs on a real CPU node (the same code as ``examples/trl_grpo.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from tangram_celery.errors import ValidationError
from tangram_celery.integrations.cases import plan_for
from tangram_celery.integrations.scoring import RewardOptions, serial_scores
from tangram_celery.integrations.trl import TestReward
from tangram_celery.settings import Settings

CpuWorkers = Callable[..., list[str]]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl_grpo.py"


@pytest.mark.slow
def test_a_grpo_step_trains_on_tangram_rewards(
        settings: Settings, cpu_workers: CpuWorkers, trl_example: ModuleType,
        tmp_path: Path) -> None:
    cpu_workers({"trl-a": 2})
    run = trl_example.train(TestReward(settings=settings), steps=1, workdir=tmp_path)
    assert len(run.steps) == 1 and run.changed
    [(completions, rewards, _)] = run.reward.calls
    assert len(completions) == 8 and all(0.0 <= r <= 1.0 for r in rewards)
    plans = [plan_for(c, trl_example.TESTS) for c in completions]
    assert rewards == [s.score for s in serial_scores(plans, RewardOptions())]
    assert any("reward" in entry for entry in run.logs)


def test_a_missing_tests_column_names_the_columns() -> None:
    reward = TestReward(serial=True)
    with pytest.raises(ValidationError, match=r"no such column.*\['answer'\]"):
        reward(["p"], ["x = 1"], answer=["1"], trainer_state=None)
    with pytest.raises(ValidationError, match="2 tests for 1 completions"):
        reward(["p"], ["x = 1"], tests=["a", "b"])


def test_the_serial_baseline_scores_in_process(trl_example: ModuleType) -> None:
    reward = TestReward(serial=True)
    assert reward.__name__ == "tangram_serial_tests"
    assert reward(["p"] * 3, ["x = 1\n", "x = 2\n", "```python\n1 / 0\n```"],
                  tests=[trl_example.TESTS] * 3) == [1.0, 0.5, 0.0]


@pytest.mark.slow
def test_the_example_compares_step_times(settings: Settings, cpu_workers: CpuWorkers) -> None:
    cpu_workers({"trl-b": 2})
    env = {**os.environ, "TANGRAM_REDIS_URL": settings.broker.redis_url,
           "TANGRAM_NODE_TTL_S": str(settings.node.ttl_s)}
    done = subprocess.run([sys.executable, str(EXAMPLE), "--steps", "1", "--group", "2",
                           "--compare"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "using 1 live CPU node(s)" in done.stdout
    assert " tangram: step time median" in done.stdout and "  serial: step time" in done.stdout
    assert "step time serial / tangram:" in done.stdout
