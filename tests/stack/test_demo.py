"""``tangram demo`` on the ``tangram up`` machinery.

Without processes: the demo's stack options give one copy of the compose file's ``cpu-node``
per node (its own ``--node``, the demo's ``--cores``), on free ports instead of the published
ones. With real processes, through the real CLI: the
demo brings up Redis, Triton, the CPU nodes and the GPU pool, prints an ACT table with CPU and
reward rows, exits 0, leaves no process and no state behind, and ignores a Redis that
``TANGRAM_REDIS_URL`` names; SIGTERM in the middle stops everything too.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis
from test_stack import wait_leftovers_gone

from tangram_celery.settings import Settings
from tangram_celery.stack.compose import DEFAULT_COMPOSE_FILE, load_compose
from tangram_celery.stack.demo import DemoConfig, stack_environment, stack_options
from tangram_celery.stack.plan import plan

ACT_ROW = r"^{kind}\s+(\d+)\s+(\d+)\s"


def test_demo_stack_runs_one_cpu_node_copy_per_node_on_free_ports(tmp_path: Path) -> None:
    config = DemoConfig(nodes=3, cores_per_node=5)
    options = stack_options(config, tmp_path, Settings())
    environ = stack_environment({"TANGRAM_REDIS_URL": "redis://elsewhere:1/0", "PATH": "/bin"})
    assert "TANGRAM_REDIS_URL" not in environ
    _, services, _, _ = plan(options, environ)
    assert list(services) == ["redis", "triton", "cpu-node-1", "cpu-node-2", "cpu-node-3",
                              "gpu-pool"]
    for index, name in enumerate(config.node_names, 1):
        argv = services[f"cpu-node-{index}"].argv
        assert argv[argv.index("--node") + 1] == name
        assert argv[argv.index("--cores") + 1] == "5"
    published = load_compose(DEFAULT_COMPOSE_FILE, {"STACK_REDIS_PASSWORD": "p",
                                                    "TANGRAM_FLOWER_PASSWORD": "p",
                                                    "TANGRAM_GATEWAY_TOKEN": "p",
                                                    "TANGRAM_TRITON_KEY": "p"})
    assert set(services["redis"].ports.values()).isdisjoint(
        published.services["redis"].ports.values())
    redis_url = services["cpu-node-1"].environment["TANGRAM_REDIS_URL"]
    assert redis_url.endswith(f"127.0.0.1:{services['redis'].ports[6379]}/0")


def _demo(tmp_path: Path, *args: str, environ: dict[str, str] | None = None
          ) -> tuple[subprocess.Popen[bytes], Path, str, Path]:
    """Start ``tangram demo`` through the CLI with a marker in its environment."""
    marker = f"tgdemo{uuid.uuid4().hex[:10]}"
    sandbox_root = Path("/var/tmp") / f"tangram-test-{marker}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TANGRAM_", "STACK_"))}
    env.update({"STACK_TEST_MARKER": marker, "TANGRAM_SANDBOX_ROOT": str(sandbox_root),
                "TMPDIR": str(tmp_path), **(environ or {})})
    output = tmp_path / "demo.out"
    with open(output, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "tangram_celery.cli", "demo", *args],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
            cwd=tmp_path)
    return process, output, marker, sandbox_root


def _reap(process: subprocess.Popen[bytes], sandbox_root: Path) -> None:
    if process.poll() is None:
        process.kill()
        process.wait(10)
    shutil.rmtree(sandbox_root, ignore_errors=True)


def _act_rows(text: str) -> dict[str, tuple[int, int]]:
    rows = {}
    for kind in ("exec", "test_run", "reward", "all"):
        found = re.search(ACT_ROW.format(kind=kind), text, re.MULTILINE)
        if found:
            rows[kind] = (int(found.group(1)), int(found.group(2)))
    return rows


@pytest.mark.slow
def test_demo_brings_up_the_stack_runs_cpu_and_reward_actions_and_stops_it(
        tmp_path: Path, redis_url: str) -> None:
    started = time.monotonic()
    process, output, marker, sandbox_root = _demo(
        tmp_path, "--trajectories", "2", "--nodes", "2", "--cores", "1", "--code-actions", "2",
        environ={"TANGRAM_REDIS_URL": redis_url})
    try:
        code = process.wait(240)
    finally:
        _reap(process, sandbox_root)
    seconds = time.monotonic() - started
    text = output.read_text(errors="replace")
    assert code == 0, text
    assert _act_rows(text) == {"exec": (4, 4), "test_run": (2, 2), "reward": (2, 2),
                               "all": (8, 8)}, text
    assert "mean reward 1.00" in text
    assert "note: the demo runs on its own Redis" in text
    for name in ("redis", "triton", "cpu-node-1", "cpu-node-2", "gpu-pool"):
        assert re.search(rf"│ {name}\s+│ stopped", text), text
    assert wait_leftovers_gone(marker, sandbox_root) == []
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("tangram-demo-")]
    client = redis.Redis.from_url(redis_url)
    assert not [k for k in client.scan_iter("*demo-node*")], "the demo used TANGRAM_REDIS_URL"
    client.close()
    print(f"tangram demo (2 trajectories, 2 nodes) ran in {seconds:.1f} s")


@pytest.mark.slow
def test_demo_stops_everything_on_sigterm(tmp_path: Path) -> None:
    process, output, marker, sandbox_root = _demo(
        tmp_path, "--trajectories", "1", "--nodes", "1", "--cores", "1")
    try:
        deadline = time.monotonic() + 180
        while "gpu-pool: started" not in output.read_text(errors="replace"):
            assert process.poll() is None and time.monotonic() < deadline, output.read_text()
            time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        code = process.wait(120)
    finally:
        _reap(process, sandbox_root)
    text = output.read_text(errors="replace")
    assert code == 130, text
    assert "redis: stopping" in text
    assert wait_leftovers_gone(marker, sandbox_root) == []
    assert "logs kept in" in text
