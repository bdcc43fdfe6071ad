"""Flower on tangram's broker: auth rules on plain data, then a real Flower on a loopback port
checked through its HTTP API and rendered in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from flower_checks import finished_in_flower, flower_json, watching_events

from tangram_celery.action import ActionResult
from tangram_celery.client import TangramClient, code_action
from tangram_celery.errors import ConfigError
from tangram_celery.observe.flower import (
    FlowerConfig,
    FlowerHandle,
    flower_argv,
    flower_process,
    resolve_auth,
    run_flower,
)
from tangram_celery.settings import Settings

CpuWorkers = Callable[..., list[str]]
ACT = re.compile(r"'act': \{'queue': ([-0-9.e]+), 'exec': ([-0-9.e]+), "
                 r"'overhead': ([-0-9.e]+), 'total': ([-0-9.e]+)\}")


def test_auth_is_on_by_default_and_never_off_in_public() -> None:
    config, generated = resolve_auth(FlowerConfig(), token=lambda: "s3cret")
    assert generated and config.password == "s3cret"
    assert "--basic-auth=tangram:s3cret" in flower_argv(config)
    assert flower_argv(config)[:3] == ["flower", "--address=127.0.0.1", "--port=5555"]
    given, generated = resolve_auth(FlowerConfig(password="pw:with:colons"))
    assert not generated and given.password == "pw:with:colons"
    local, _ = resolve_auth(FlowerConfig(unauthenticated=True))
    assert not any(a.startswith("--basic-auth") for a in flower_argv(local))
    for address in ("0.0.0.0", "", "10.1.2.3"):
        with pytest.raises(ConfigError, match="refusing to start Flower without auth"):
            resolve_auth(FlowerConfig(address=address, unauthenticated=True))
    with pytest.raises(ConfigError, match="','"):
        resolve_auth(FlowerConfig(password="a,b"))
    with pytest.raises(ConfigError, match="USER"):
        resolve_auth(FlowerConfig(user="a:b"))


def test_run_flower_refuses_before_starting(settings: Settings) -> None:
    lines: list[str] = []
    with pytest.raises(ConfigError):
        run_flower(settings, address="0.0.0.0", unauthenticated=True, announce=lines.append)
    assert lines == []


def run_in_flower(settings: Settings, cpu_workers: CpuWorkers, node: str, flower: FlowerHandle
                  ) -> list[ActionResult]:
    cpu_workers({node: 1})
    payload = "x = 1\n" * 20_000  # a large payload must not reach Flower's argument column
    with TangramClient(settings) as client:
        watching_events(flower, client, f"{node}-probe")
        results = client.run_batch(
            [code_action(f"fl-{k}", f"{payload}print({k} * 7)") for k in range(3)], timeout=60)
        for k in range(3):
            client.end_trajectory(f"fl-{k}")
    assert all(r.ok for r in results), [r.output for r in results]
    return results


@pytest.mark.slow
def test_flower_lists_tangram_tasks_behind_basic_auth(
    settings: Settings, cpu_workers: CpuWorkers, tmp_path: Path
) -> None:
    with flower_process(settings, log_path=tmp_path / "flower.log") as flower:
        for path in ("/api/tasks", "/", "/api/workers"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                flower_json(flower, path, auth=False)
            assert refused.value.code == 401, path
        results = run_in_flower(settings, cpu_workers, "fl-a", flower)
        tasks = finished_in_flower(flower, [r.action_id for r in results])
    for k, result in enumerate(results):
        task = tasks[result.action_id]
        assert task["name"] == "tangram.action.exec"
        assert task["args"] == f"traj=fl-{k} kind=exec cpu=1"
        assert task["worker"].startswith("cpu-fl-a@") and task["routing_key"] == "tangram.cpu.fl-a"
        assert task["sent"] and task["received"] and task["started"], "events of both sides"
        match = ACT.search(task["result"])
        assert match, task["result"][:300]
        queue, exec_s, overhead, total = map(float, match.groups())
        assert exec_s == pytest.approx(result.act["exec"], abs=1e-9)
        assert queue + exec_s + overhead == pytest.approx(total, abs=1e-6)
        assert 0 < total <= result.act["total"], "the worker's view ends at the result store"


@pytest.mark.slow
def test_flower_task_page_renders_in_headless_chromium(
    settings: Settings, cpu_workers: CpuWorkers, tmp_path: Path
) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.fail("Debian's chromium is not installed: run `bash scripts/run.sh setup`",
                    pytrace=False)
    with flower_process(settings, log_path=tmp_path / "flower.log") as flower:
        results = run_in_flower(settings, cpu_workers, "fl-b", flower)
        finished_in_flower(flower, [r.action_id for r in results])
        config = flower.config
        page = (f"http://{config.user}:{config.password}@{config.address}:{config.port}"
                f"/task/{results[0].action_id}")
        base = [chromium, "--headless", "--no-sandbox", "--disable-gpu",
                "--disable-background-networking", "--disable-dev-shm-usage",
                f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,900",
                "--virtual-time-budget=4000"]
        dom = subprocess.run([*base, "--dump-dom", page], capture_output=True, text=True,
                             timeout=120)
        png = tmp_path / "flower-task.png"
        shot = subprocess.run([*base, f"--screenshot={png}", page], capture_output=True,
                              text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "tangram.action.exec" in dom.stdout and results[0].action_id in dom.stdout
    assert "traj=fl-0 kind=exec cpu=1" in dom.stdout
    assert "&#39;act&#39;: {&#39;queue&#39;" in dom.stdout or "'act': {'queue'" in dom.stdout
    assert shot.returncode == 0, shot.stderr[-2000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
