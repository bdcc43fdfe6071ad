"""The real stack's ``tangram:malleable`` system: its emulated test runs are real pytest runs
through the malleable runner, on a node that resizes them (``TANGRAM_MALLEABLE_RESIZE=1``)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tangram_bench.elastic import real_workload, run_real, scheduler_for
from tangram_bench.elastic.actions import MALLEABLE, MALLEABLE_FIXED, action_for, worker_env
from tangram_bench.emulation import MALLEABLE_TESTS_PER_CORE, malleable_suite
from tangram_bench.sim.invariants import incomplete, parts_mismatch
from tangram_celery.sandbox.malleable import PLUGIN
from tangram_celery.settings import Settings

CORES = 4
ROOT = Path(__file__).resolve().parents[2]


def load_suite(path: Path, source: str) -> object:
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"emulated_{path.parent.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_suites_single_core_work_is_t1_with_its_serial_part_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    suite = load_suite(tmp_path / "test_emulated.py", malleable_suite(3.3, 0.8, 6))
    suite.test_0_serial()  # type: ignore[attr-defined]
    assert slept == [pytest.approx(0.2 * 3.3)]
    for share in range(6):
        suite.test_parallel(share)  # type: ignore[attr-defined]
    assert sum(slept) == pytest.approx(3.3, abs=1e-5)
    assert slept[1:] == [pytest.approx(0.8 * 3.3 / 6)] * 6
    with pytest.raises(ValueError, match="at least one parallel test"):
        malleable_suite(1.0, 0.5, 0)


def summary(stdout: str) -> str:
    """The counts of pytest's summary line (its duration left out)."""
    line = [x for x in stdout.splitlines() if re.search(r"\d+ (passed|failed)", x)][-1]
    return re.sub(r" in [\d.]+s.*", "", line.strip("= "))


def test_the_suites_verdict_through_the_malleable_runner_equals_plain_pytests(
        tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    verdicts = []
    for name, extra in (("plain", []), ("malleable", ["-p", PLUGIN, "--malleable=2"])):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "test_emulated.py").write_text(malleable_suite(0.3, 0.75, 4))
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra, name],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
        verdicts.append((done.returncode, summary(done.stdout)))
    assert verdicts[0] == verdicts[1] == (0, "5 passed")


def test_the_malleable_system_submits_malleable_runs_that_declare_no_duration() -> None:
    workload = real_workload(4, 1, CORES)
    specs = [spec for t in workload.trajectories for spec in t.actions]
    actions = [action_for(spec, "t", MALLEABLE, CORES) for spec in specs]
    assert all(a.t1 is None for a in actions)
    plain = [action_for(spec, "t", "tangram", CORES) for spec in specs]
    for spec, action, other in zip(specs, actions, plain, strict=True):
        if spec.kind != "test_run":
            assert action.payload == other.payload
            continue
        assert action.payload["malleable"] is True
        assert action.signature == other.signature
        assert action.elasticity == other.elasticity
        (path, source), = action.payload["files"].items()
        folder = path.split("/")[0]
        assert action.payload["cmd"].endswith(f"pytest -q -p no:cacheprovider {folder}")
        assert source.count("time.sleep(") == 3
        assert f"range({MALLEABLE_TESTS_PER_CORE * CORES})" in source
    assert scheduler_for(MALLEABLE) == scheduler_for("tangram")
    assert worker_env(MALLEABLE) == {"TANGRAM_SCHEDULER": scheduler_for("tangram"),
                                     "TANGRAM_MALLEABLE_RESIZE": "1"}
    assert worker_env("tangram")["TANGRAM_MALLEABLE_RESIZE"] == "0"
    assert worker_env(MALLEABLE_FIXED) == worker_env("tangram")
    control = [action_for(spec, "t", MALLEABLE_FIXED, CORES) for spec in specs]
    assert [a.payload.get("malleable") for a in control] == \
        [a.payload.get("malleable") for a in actions]


@pytest.mark.slow
def test_a_short_real_run_of_the_malleable_system_completes(settings: Settings) -> None:
    workload = real_workload(3, 2, CORES)
    try:
        result = run_real(workload, MALLEABLE, CORES, {"batch": 3, "cores": CORES},
                          settings=settings)
    finally:
        shutil.rmtree(settings.sandbox.root, ignore_errors=True)
    assert incomplete(workload, result) == []
    assert parts_mismatch(result) == []
    assert all(r.total >= r.exec > 0 and r.queue >= 0 for r in result.records)
    assert {r.kind for r in result.records} == {"exec", "test_run"}
    assert result.decide_calls >= 1
