"""The in-worker Celery autoscaler: its pure target (tables) and a real prefork worker."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tangram_celery.autoscale.actuators import worker_target
from tangram_celery.autoscale.work import Work

# (case, processes, active, queued work, min, max, expected processes)
TABLE = [
    ("idle stays at min", 1, 0, [], 1, 8, 1),
    ("long queued work grows", 1, 1, [Work(4.0, 0, 1)] * 3, 1, 8, 7),
    ("tiny queued work does not", 2, 1, [Work(0.001, 0, 1)] * 20, 1, 8, 2),
    ("capped at max", 2, 2, [Work(10.0, 0, 1)] * 9, 1, 4, 4),
    ("shrinks, keeping a hysteresis margin", 6, 2, [], 1, 8, 4),
]


@pytest.mark.parametrize(("case", "procs", "active", "queued", "low", "high", "want"), TABLE,
                         ids=[row[0] for row in TABLE])
def test_worker_target(case: str, procs: int, active: int, queued: list[Work], low: int,
                       high: int, want: int) -> None:
    assert worker_target(procs, active, queued, low, high, target_wait_s=2.0) == want


AUTOSCALER = "tangram_celery.autoscale.actuators:ActAwareAutoscaler"


def test_the_documented_autoscaler_name_resolves() -> None:
    """The name a Celery app puts in ``worker_autoscaler`` (the class's own docstring gives it)."""
    from celery.utils.imports import symbol_by_name

    from tangram_celery.autoscale.actuators.autoscaler import ActAwareAutoscaler

    assert symbol_by_name(AUTOSCALER) is ActAwareAutoscaler
    assert AUTOSCALER in (ActAwareAutoscaler.__doc__ or "")


APP = textwrap.dedent("""
    import os, time
    from celery import Celery
    app = Celery("t", broker=os.environ["AUTOAPP_BROKER"], backend=os.environ["AUTOAPP_BROKER"])
    app.conf.worker_autoscaler = "tangram_celery.autoscale.actuators:ActAwareAutoscaler"
    app.conf.worker_prefetch_multiplier = 4

    @app.task(name="sleep")
    def sleep(action):
        time.sleep(action["t1"])
        return action["t1"]
""")


@pytest.mark.slow
def test_prefork_worker_grows_by_predicted_work(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real prefork worker started with ``--autoscale=4,1`` and our autoscaler grows past one
    process when long actions are queued."""
    (tmp_path / "autoapp.py").write_text(APP)
    worker = subprocess.Popen(
        [sys.executable, "-c",
         f"import sys; sys.argv=['celery']; sys.path.insert(0, {str(tmp_path)!r}); "
         f"import autoapp; autoapp.app.worker_main(['worker', '-P', 'prefork', "
         f"'--autoscale=4,1', '-n', 'auto@t', '--without-mingle', '--without-gossip', "
         f"'-l', 'INFO'])"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PATH": "/usr/bin:/bin",
             "AUTOAPP_BROKER": redis_url},
    )
    monkeypatch.setenv("AUTOAPP_BROKER", redis_url)
    sys.path.insert(0, str(tmp_path))
    try:
        import autoapp

        app = autoapp.app
        from tangram_bench.emulation import emulated_exec

        body = {**emulated_exec("traj", 2.0).to_json(), "t1": 2.0}
        results = [app.send_task("sleep", args=[body]) for _ in range(8)]
        grown = 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and grown < 2:
            stats = app.control.inspect(destination=["auto@t"], timeout=1).stats() or {}
            grown = int(stats.get("auto@t", {}).get("autoscaler", {}).get("current", 0))
            time.sleep(0.5)
        if grown < 2 and worker.poll() is not None:
            assert worker.stdout is not None
            said = worker.stdout.read().decode(errors="replace")
            pytest.fail(f"the worker exited: {said[-3000:]}")
        assert grown >= 2, "prefork pool did not grow"
        assert [r.get(timeout=60) for r in results] == [2.0] * 8
    finally:
        sys.path.remove(str(tmp_path))
        worker.terminate()
        worker.wait(20)
