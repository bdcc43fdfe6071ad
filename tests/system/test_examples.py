"""The examples run against a live cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tangram_celery.settings import Settings

CpuWorkers = Callable[..., list[str]]
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_grpo_step_example_runs(settings: Settings, cpu_workers: CpuWorkers) -> None:
    cpu_workers({"ex-a": 2})
    env = {**os.environ, "TANGRAM_REDIS_URL": settings.broker.redis_url,
           "TANGRAM_NODE_TTL_S": str(settings.node.ttl_s)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "grpo_step.py"), "--prompts", "2", "--group",
         "2", "--turns", "2"], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "using 1 live CPU node(s)" in done.stdout
    assert "step 0: 4 rollouts, 16 actions" in done.stdout and "step time" in done.stdout
    assert "test_run" in done.stdout and "exec" in done.stdout
