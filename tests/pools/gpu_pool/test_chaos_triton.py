"""Triton crashes under a real GPU pool worker: the tritonserver is SIGKILLed mid-batch of reward
actions. If it comes back (same ports) every action completes exactly once, its services loaded
again; if it never does, every pending action gets a clear error naming Triton within the
worker's retry window (``--triton-retry-s``)."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
import redis

from tangram_celery import keys
from tangram_celery.action import Action, ActionResult
from tangram_celery.client import ActionHandle, TangramClient
from tangram_celery.errors import TritonUnavailable
from tangram_celery.pools.gpu_pool import (
    GpuPoolRuntime,
    gave_up,
    retry_delays,
    reward_action,
    worker_name,
)
from tangram_celery.pools.launch import spawn_gpu_worker, wait_for_worker
from tangram_celery.processes import stop_process
from tangram_celery.reward.executor import RewardOutcome
from tangram_celery.reward.server import ServerPorts, TritonServer
from tangram_celery.settings import Settings
from tangram_celery.tasks.app import make_app

REPOSITORY = Path(__file__).resolve().parents[3] / "triton_models"
ROWS = [("\\boxed{7}", "7", 1.0), ("41", "42", 0.0), ("1e3", "1000", 1.0), ("London", "Paris", 0.0)]


@contextlib.contextmanager
def triton(workdir: Path) -> Iterator[TritonServer]:
    """A private tritonserver on fixed free ports (so a restart comes back on the same ones)."""
    server = TritonServer(REPOSITORY, ports=ServerPorts.pick(), workdir=workdir)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def crash(server: TritonServer) -> None:
    """SIGKILL the server's whole process group (python backend stubs included), reap it and
    drop its shared-memory regions, as an operator would before starting it again."""
    assert server.pid is not None
    os.killpg(server.pid, signal.SIGKILL)
    server.stop()  # only reaps: the process is gone
    for region in Path("/dev/shm").glob(f"{server.shm_prefix}*"):
        with contextlib.suppress(OSError):
            region.unlink()


@contextlib.contextmanager
def gpu_pool(settings: Settings, server: TritonServer, pool: str, retry_s: float,
             logs: Path) -> Iterator[str]:
    """A real GPU pool worker subprocess (4 simulated GPUs) on ``server``."""
    env = {"TANGRAM_REDIS_URL": settings.broker.redis_url, "TANGRAM_TRITON_URL": server.http_url,
           "TANGRAM_TRITON_REPOSITORY": str(REPOSITORY)}
    process = spawn_gpu_worker(env, pool, 4, logs / f"gpu-{pool}.log",
                               ["--triton-retry-s", str(retry_s)])
    try:
        name = worker_name(pool, process.pid)
        wait_for_worker(make_app(settings), name, process)
        yield name
    finally:
        stop_process(process, timeout=30)


def batch(pool: str, count: int) -> list[Action]:
    """``count`` answer_match actions, with known rewards (``ROWS``), ids ``<pool>-NNNN``."""
    return [reward_action(f"{pool}-t{i % 8}", "answer_match",
                          {"response": ROWS[i % 4][0], "reference": ROWS[i % 4][1]},
                          pool=pool, id=f"{pool}-{i:04d}") for i in range(count)]


def stored(client: redis.Redis, handles: list[ActionHandle]) -> int:
    """How many of ``handles`` have a stored result."""
    return sum(raw is not None for raw in client.mget([keys.action_result(h.id) for h in handles]))


def wait_until(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"condition not met in {timeout} s"
        time.sleep(0.02)


@pytest.mark.slow
def test_triton_killed_mid_batch_comes_back_and_nothing_is_lost_or_doubled(
    settings: Settings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    actions = batch("tcrash", 400)
    with triton(tmp_path / "triton") as server, \
            gpu_pool(settings, server, "tcrash", 60, tmp_path), \
            TangramClient(settings) as client:
        handles = client.submit_many(actions)
        wait_until(lambda: stored(redis_client, handles) >= 40, 120)
        done_at_kill = stored(redis_client, handles)
        crash(server)
        time.sleep(2.0)
        server.start()
        back_at = time.time()
        results = [h.result(timeout=180) for h in handles]
    assert done_at_kill < len(actions), "the batch was over before the crash: it proved nothing"
    for action, result in zip(actions, results, strict=True):
        assert result.action_id == action.id and result.ok, (result.status, result.error)
        assert result.output["reward"] == ROWS[int(action.id[-4:]) % 4][2]
        raw = redis_client.get(keys.action_result(action.id))
        assert json.loads(raw or b"{}")["status"] == "ok"
    assert int(redis_client.get(keys.DUPLICATE_RESULTS) or 0) == 0
    waited = [r for r in results if r.timings.admitted < back_at < r.timings.exec_finished]
    reloaded = [r for r in results if r.output["loaded"] and r.timings.exec_started > back_at]
    assert reloaded, "the restarted server's services were not loaded again"
    assert waited, "no action waited for the server: the retry was not exercised"
    print(f"triton-crash chaos: {len(results)} actions, 1 SIGKILL of tritonserver, "
          f"{len(results) - done_at_kill} pending at the kill, {len(waited)} admitted during "
          f"the outage rode it out, "
          f"{len(reloaded)} reloads, lost 0, duplicated 0")


@pytest.mark.slow
def test_triton_that_never_comes_back_fails_every_pending_action_clearly(
    settings: Settings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    retry_s = 4.0
    actions = batch("tgone", 200)
    with triton(tmp_path / "triton") as server, \
            gpu_pool(settings, server, "tgone", retry_s, tmp_path), \
            TangramClient(settings) as client:
        handles = client.submit_many(actions)
        wait_until(lambda: stored(redis_client, handles) >= 20, 120)
        crash(server)
        killed_at = time.time()
        results = [h.result(timeout=60) for h in handles]
        finished = time.time()
    failed = [r for r in results if not r.ok]
    assert failed, "the batch was over before the crash: it proved nothing"
    assert finished - killed_at < retry_s + 10, "pending actions waited past the retry window"
    for result in failed:
        check_clear_error(result, retry_s)
    assert all(r.timings.stored < killed_at + retry_s + 5 for r in failed)
    assert int(redis_client.get(keys.DUPLICATE_RESULTS) or 0) == 0
    print(f"triton-gone chaos: {len(results)} actions, {len(failed)} failed clearly, lost 0")


def check_clear_error(result: ActionResult, retry_s: float) -> None:
    """An ``error`` result that names Triton, the retry window and how to start a server."""
    assert result.status == "error", (result.status, result.error)
    assert "Triton did not come back within" in result.error, result.error
    assert f"{retry_s:g} s" in result.error and "TANGRAM_TRITON_RETRY_S" in result.error
    assert "python -m tangram_celery.reward.server" in result.error, result.error
    assert "Traceback" not in result.error


# --------------------------------------------------------------------------- the retry, no server


class FlakyExecutor:
    """The FakeExecutor of test_gpu_pool whose first ``failures`` runs find Triton down."""

    def __init__(self, failures: int) -> None:
        from test_gpu_pool import FakeExecutor

        self.inner = FakeExecutor()
        self.failures = failures
        self.calls = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def run(self, model: str, inputs: Mapping[str, object], gpus: tuple[int, ...]
            ) -> RewardOutcome:
        self.calls += 1
        if self.calls <= self.failures:
            raise TritonUnavailable("Triton at 127.0.0.1:1 did not answer the inference: refused")
        return self.inner.run(model, inputs, gpus)


def flaky_runtime(failures: int, retry_s: float) -> tuple[GpuPoolRuntime, FlakyExecutor]:
    executor = FlakyExecutor(failures)
    runtime = GpuPoolRuntime(Settings.from_env({}), "flaky", executor,  # type: ignore[arg-type]
                             range(2), 2, name="w", triton_retry_s=retry_s)
    return runtime, executor


def test_backoff_doubles_up_to_its_cap() -> None:
    assert list(itertools.islice(retry_delays(0.2, 1.0), 5)) == [0.2, 0.4, 0.8, 1.0, 1.0]
    error = gave_up(TritonUnavailable("Triton at h:1 did not answer"), 30)
    assert "within 30 s" in str(error) and "python -m tangram_celery.reward.server" in str(error)


def test_an_action_rides_out_a_short_outage_and_the_outage_ends() -> None:
    runtime, executor = flaky_runtime(failures=2, retry_s=10)
    result = runtime.execute(reward_action("t", "answer_match", {"response": "1",
                                                                 "reference": "1"}).to_json(), 0)
    assert result["status"] == "ok" and executor.calls == 3
    assert runtime._down_since is None, "the pool's outage clock was reset"


def test_once_the_outage_outlasts_the_window_actions_fail_at_once() -> None:
    runtime, _ = flaky_runtime(failures=10**6, retry_s=0.5)
    action = reward_action("t", "answer_match", {"response": "1", "reference": "1"})
    started = time.monotonic()
    first = runtime.execute(action.to_json(), 0)
    waited = time.monotonic() - started
    started = time.monotonic()
    second = runtime.execute(action.to_json(), 0)
    assert 0.5 <= waited < 2 and time.monotonic() - started < 0.4  # at once: not the 0.5 s window
    for result in (first, second):
        assert result["status"] == "error" and "did not come back within 0.5 s" in result["error"]
    assert sum(r["units"] != [] for r in (first, second)) == 2, "each held and released its GPU"
    assert runtime.admission.free_count() == 2
