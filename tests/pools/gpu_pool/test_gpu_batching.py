"""Cross-request batching on a GPU pool: reward actions of a service that is already running on
a chunk join it (Triton's dynamic batching merges them) instead of waiting for free GPUs.

The join rule is a pure function (table test); the runtime is checked with a fake executor
that holds every run until told; end to end (``slow``) with the real tritonserver and a real
GPU pool worker of **one simulated GPU** (this machine has no GPU).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest
from test_gpu_pool import TRUTH, FakeExecutor, GpuWorkers, am, gpu_workers, message  # noqa: F401

from tangram_celery.action import ActionResult
from tangram_celery.errors import ConfigError
from tangram_celery.pools.gpu_pool import Batch, GpuPoolRuntime, gate_joiners, join_target
from tangram_celery.reward.executor import RewardOutcome
from tangram_celery.settings import Settings

AM, SEM = "answer_match", "semantic_similarity"


@pytest.mark.parametrize(
    ("model", "sizes", "batches", "waiting", "max_batch", "want"),
    [
        (AM, [1], [], [], 16, None),
        (AM, [1], [Batch(AM, (0,), "a")], [], 16, (0,)),
        (AM, [1], [Batch(SEM, (0,), "a")], [], 16, None),
        (AM, [1], [Batch(AM, (0, 1), "a")], [], 16, None),
        (AM, [1, 2], [Batch(AM, (0, 1), "a")], [], 16, (0, 1)),
        (AM, [1], [Batch(AM, (0,), "a", joiners=16)], [], 16, None),
        (AM, [1], [Batch(AM, (0,), "a", joiners=15)], [], 16, (0,)),
        (AM, [1], [Batch(AM, (0,), "a")], [AM], 16, None),
        (AM, [1], [Batch(AM, (0,), "a")], [SEM], 16, (0,)),
        (AM, [1], [Batch(AM, (0,), "a")], [], 0, None),
        (AM, [1], [Batch(AM, (0,), "a", joiners=3), Batch(AM, (1,), "b", joiners=1)], [], 16,
         (1,)),
    ],
)
def test_join_rule(model: str, sizes: list[int], batches: list[Batch], waiting: list[str],
                   max_batch: int, want: tuple[int, ...] | None) -> None:
    target = join_target(model, sizes, batches, waiting, max_batch)
    assert (None if target is None else target.units) == want


@pytest.mark.parametrize(
    ("size", "waiting", "max_batch", "want"),
    [
        (1, [], 16, []),
        (1, [("a", AM, [1]), ("b", SEM, [1]), ("c", AM, [1, 2])], 16, ["a", "c"]),
        (1, [("a", AM, [1]), ("b", AM, [1]), ("c", AM, [1])], 2, ["a", "b"]),
        (2, [("a", AM, [2]), ("b", AM, [1]), ("c", AM, [2])], 16, ["a"]),
        (1, [("a", SEM, [1])], 16, []),
    ],
)
def test_gate_joiners_are_the_oldest_of_the_model_in_order(
    size: int, waiting: list[tuple[str, str, list[int]]], max_batch: int, want: list[str]
) -> None:
    assert gate_joiners(AM, size, waiting, max_batch) == want


class HeldExecutor(FakeExecutor):
    """Every run waits for ``go``; ``entered`` counts runs that started."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.entered = 0
        self.guard = threading.Lock()

    def run(self, model: str, inputs: Mapping[str, Any], gpus: tuple[int, ...]) -> RewardOutcome:
        with self.guard:
            self.entered += 1
        self.go.wait(10)
        return super().run(model, inputs, gpus)


def wait_until(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.005)


def burst_on_one_gpu(batching: bool, max_batch: int, count: int) -> list[ActionResult]:
    """``count`` actions on a 1-GPU runtime while the first one holds the GPU."""
    executor = HeldExecutor()
    runtime = GpuPoolRuntime(Settings.from_env({}), "unit", executor, range(1), 1, name="w",
                             batching=batching, max_batch=max_batch)
    results: list[ActionResult] = []

    def one() -> None:
        results.append(ActionResult.from_json(runtime.execute(message(), time.time())))

    threads = [threading.Thread(target=one) for _ in range(count)]
    threads[0].start()
    wait_until(lambda: executor.entered == 1)
    for thread in threads[1:]:
        thread.start()
    joiners = min(count - 1, max_batch) if batching else 0
    wait_until(lambda: executor.entered == 1 + joiners
               and runtime.admission.waiting_count() == count - 1 - joiners)
    executor.go.set()
    for thread in threads:
        thread.join(10)
    assert runtime.admission.free_count() == 1 and not runtime._batches
    return results


def test_a_burst_joins_the_running_batch_up_to_max_batch() -> None:
    results = burst_on_one_gpu(batching=True, max_batch=3, count=6)
    assert all(r.ok and r.units == (0,) for r in results)
    assert sum(r.output["joined"] for r in results) == 3 + 1, \
        "3 join the first batch; of the 2 left in the gate, the first opens a batch, one joins"


def test_without_batching_nothing_joins() -> None:
    results = burst_on_one_gpu(batching=False, max_batch=16, count=4)
    assert all(r.ok for r in results) and not any(r.output["joined"] for r in results)


def test_max_batch_is_checked() -> None:
    with pytest.raises(ConfigError):
        GpuPoolRuntime(Settings.from_env({}), "p", FakeExecutor(), range(1), 1, max_batch=0)


# --------------------------------------------------------------------------- end to end


def burst_results(settings: Settings, pool: str, count: int) -> list[ActionResult]:
    from tangram_celery.client import TangramClient

    actions = [am(r, ref, pool) for r, ref, _ in (TRUTH * count)[:count]]
    with TangramClient(settings) as client:
        results = client.run_batch(actions, timeout=240)
    wants = [want for _, _, want in (TRUTH * count)[:count]]
    assert all(r.ok for r in results), [(r.status, r.error) for r in results]
    assert [r.output["reward"] for r in results] == wants
    assert all(r.units == (0,) for r in results)
    return results


@pytest.mark.slow
def test_a_burst_on_one_gpu_is_served_in_batches(
    settings: Settings, gpu_workers: GpuWorkers  # noqa: F811
) -> None:
    gpu_workers("batch", 1, "--concurrency", "32")
    results = burst_results(settings, "batch", 32)
    joined = [r for r in results if r.output["joined"]]
    assert len(joined) >= 2, "a burst on one GPU joins the running batch"
    for result in joined:
        assert result.output["service"] == "batch__answer_match__dop1__g0"
        assert 0 < result.timings.exec_s < 5 and result.timings.exec_started >= \
            result.timings.admitted


@pytest.mark.slow
def test_no_batching_gives_every_action_its_own_turn(
    settings: Settings, gpu_workers: GpuWorkers  # noqa: F811
) -> None:
    gpu_workers("nobatch", 1, "--concurrency", "32", "--no-batching")
    results = burst_results(settings, "nobatch", 32)
    assert not any(r.output["joined"] for r in results)
    ordered = sorted(results, key=lambda r: r.timings.admitted)
    for before, after in itertools.pairwise(ordered):
        assert before.timings.exec_finished <= after.timings.admitted + 1e-3
