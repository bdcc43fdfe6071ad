"""`tangram bench overhead --json` runs the whole comparison and prints one JSON object."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_overhead_report import KEYS

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_command_prints_one_json_object_with_every_key(redis_url: str,
                                                          tmp_path: Path) -> None:
    env = {**os.environ, "TANGRAM_REDIS_URL": redis_url, "PYTHONPATH": str(REPO),
           "TANGRAM_SANDBOX_ROOT": str(Path("/var/tmp") / f"tangram-bench-test-{os.getpid()}")}
    done = subprocess.run(
        [sys.executable, "-m", "tangram_celery.cli", "bench", "overhead", "--json", "--n", "3",
         "--rounds", "1", "--docker-url", f"unix://{tmp_path}/no-engine.sock"],
        capture_output=True, text=True, env=env, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    for key in KEYS:
        assert key in report
        if key != "docker_warm_exec_p50_ms":
            assert isinstance(report[key], float) and report[key] > 0, (key, report[key])
    assert report["docker_warm_exec_p50_ms"] is None and "docker_error" in report
    assert set(report["targets_met"]) and report["cores"] == 2
