"""A malleable run grows and shrinks while it runs, through its control socket, and its verdict
is still a plain run's. The order is made by a gate file (the first test and all but the first
four of the rest wait for it) and the run's own log, not by timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from malleable_runs import ROOT, gated_suite, malleable_args, pytest_run, verdict_of

from tangram_celery.sandbox.malleable import resize

pytestmark = pytest.mark.slow

SUITE = gated_suite('os.environ["MALLEABLE_LOG"]', 'os.environ["MALLEABLE_GATE"]', 16, "i >= 4",
                    tail="    time.sleep(0.05)\n")
WAIT_S = 120.0


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def lines(log: Path) -> list[list[str]]:
    return [line.split()[:2] for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture()
def suite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Path]:
    root = tmp_path / "suite"
    root.mkdir()
    (root / "test_resize.py").write_text(SUITE)
    log, gate = tmp_path / "log", tmp_path / "gate"
    monkeypatch.setenv("MALLEABLE_LOG", str(log))
    monkeypatch.setenv("MALLEABLE_GATE", str(gate))
    return root, log, gate


def start(root: Path, workers: int, control: Path, stats: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         *malleable_args(workers, f"--malleable-control={control}",
                         f"--malleable-stats={stats}")],
        cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def plain_verdict(root: Path, gate: Path) -> object:
    gate.touch()
    verdict, _ = pytest_run(root, [])
    gate.unlink()
    return verdict


def test_a_run_that_grows_mid_run(suite: tuple[Path, Path, Path], tmp_path: Path) -> None:
    root, log, gate = suite
    expected = plain_verdict(root, gate)
    log.unlink()
    control, stats = tmp_path / "control.sock", tmp_path / "stats.json"
    proc = start(root, 1, control, stats)
    try:
        wait_until(lambda: any(name == "gate" for _, name in lines(log)), "the gate test")
        first = lines(log)[0][0]
        answer = resize(str(control), "grow")
        assert answer["ok"] and answer["workers"] == 2
        wait_until(lambda: sum(pid != first for pid, _ in lines(log)) >= 3,
                   "the new worker's tests")
        gate.touch()
        out, _ = proc.communicate(timeout=WAIT_S)
    finally:
        proc.kill()
    assert verdict_of(out, proc.returncode) == expected, out[-3000:]
    assert len({pid for pid, _ in lines(log)}) == 2
    data = json.loads(stats.read_text())
    assert [r["kind"] for r in data["resizes"]] == ["grow"]
    assert sum(w["tests"] for w in data["workers"]) == 17


def test_a_run_that_shrinks_mid_run(suite: tuple[Path, Path, Path], tmp_path: Path) -> None:
    root, log, gate = suite
    expected = plain_verdict(root, gate)
    log.unlink()
    control, stats = tmp_path / "control.sock", tmp_path / "stats.json"
    proc = start(root, 2, control, stats)
    try:
        wait_until(lambda: len({pid for pid, _ in lines(log)}) == 2, "both workers")
        gated = next(pid for pid, name in lines(log) if name == "gate")
        answer = resize(str(control), "shrink")
        assert answer["ok"] and answer["workers"] == 1
        retiring = str(answer["retiring"])
        with log.open("a") as stream:
            stream.write("- shrunk\n")
        refused = resize(str(control), "shrink")
        assert not refused["ok"] and refused["workers"] == 1
        gate.touch()
        out, _ = proc.communicate(timeout=WAIT_S)
    finally:
        proc.kill()
    assert verdict_of(out, proc.returncode) == expected, out[-3000:]
    after = lines(log)[[name for _, name in lines(log)].index("shrunk") + 1:]
    assert sum(pid == retiring for pid, _ in after) <= (0 if retiring == gated else 1), after
    assert any(pid != retiring for pid, _ in after), "the run went on on the other worker"
    data = json.loads(stats.read_text())
    assert [r["kind"] for r in data["resizes"]] == ["shrink"]
    assert sum(w["tests"] for w in data["workers"]) == 17
