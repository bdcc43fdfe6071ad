"""RewardExecutor + GpuManager on the real server, with simulated GPU ids (no GPU here)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tangram_celery.errors import ServiceError, ValidationError
from tangram_celery.managers.gpu import Chunk, GpuManager, service_name
from tangram_celery.processes import free_port
from tangram_celery.reward.executor import RewardExecutor, RewardOutcome
from tangram_celery.reward.server import TritonServer
from tangram_celery.reward.triton import TritonClient

PAIR = {"response": "The answer is \\boxed{7}", "reference": "7"}


def make_executor(
    server: TritonServer, repository: Path, **kwargs: object
) -> RewardExecutor:
    options: dict[str, object] = {"gpu_ids": range(4), "gpu_memory_mb": 128}
    options.update(kwargs)
    return RewardExecutor(server.http_url, repository, **options)  # type: ignore[arg-type]


@pytest.fixture()
def executor(triton_server: TritonServer, repository: Path) -> Iterator[RewardExecutor]:
    """Four simulated GPUs with room for two answer_match services (64 MB) each."""
    executor = make_executor(triton_server, repository)
    yield executor
    executor.close()


def am(chunk: Chunk) -> str:
    return service_name("answer_match", chunk)


def run(executor: RewardExecutor, chunk: Chunk) -> RewardOutcome:
    outcome = executor.run("answer_match", PAIR, chunk)
    assert outcome.output == {"reward": 1.0}
    return outcome


def test_outcome_reports_setup_and_exec(executor: RewardExecutor) -> None:
    first = run(executor, (0,))
    assert first.loaded and first.setup_s > 0 and first.exec_s > 0
    assert first.triton_model == am((0,)) and first.evicted == []
    again = run(executor, (0,))
    assert not again.loaded and again.setup_s < first.setup_s
    assert again.to_json()["output"] == {"reward": 1.0}


def test_lru_eviction_order_under_a_small_gpu_budget(
    executor: RewardExecutor, http_client: TritonClient
) -> None:
    steps: list[tuple[Chunk, bool, list[str]]] = [
        ((0,), True, []),
        ((0, 1), True, []),  # GPU 0 now full: 64 + 64 MB
        ((0,), False, []),  # resident: runs now, and is now more recent than dop2
        ((0, 1, 2, 3), True, [am((0, 1))]),  # GPU 0 full: evict its LRU resident
        ((1,), True, []),  # GPU 1: dop4 + dop1 fit
        ((0,), False, []),
        ((0, 1), True, [am((0, 1, 2, 3))]),  # LRU among dop4 (step 4), dop1@1, dop1@0
    ]
    for chunk, loaded, evicted in steps:
        outcome = run(executor, chunk)
        assert (outcome.loaded, outcome.evicted) == (loaded, evicted), chunk
    residents = set(executor.manager.residents())
    assert residents == {am((0,)), am((1,)), am((0, 1))}
    for name in residents:
        assert http_client.model_ready(name)
    for name in (am((0, 1, 2, 3)),):
        assert not http_client.model_ready(name)


def test_a_chunk_holding_the_service_ranks_first(executor: RewardExecutor) -> None:
    run(executor, (2,))
    assert executor.rank_chunks("answer_match", [(0,), (1,), (2,), (3,)])[0] == (2,)


def test_simulated_gpus_load_one_cpu_instance_each(
    executor: RewardExecutor, http_client: TritonClient
) -> None:
    run(executor, (0, 1))
    config = http_client.model_config(am((0, 1)))
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert config["instance_group"][0]["count"] == 2
    assert config["parameters"]["tangram_gpus"] == {"string_value": "0,1"}
    assert config["parameters"]["tangram_simulated"] == {"string_value": "true"}


def test_grpc_executor(triton_server: TritonServer, repository: Path) -> None:
    executor = RewardExecutor(triton_server.grpc_url, repository, gpu_ids=[0, 1], protocol="grpc")
    try:
        outcome = executor.run(
            "answer_match", {"response": ["1/2", "3"], "reference": ["0.5", "4"]}, (1,)
        )
        assert outcome.output == {"reward": [1.0, 0.0]}
    finally:
        executor.close()


@pytest.mark.parametrize(
    ("model", "inputs", "gpus", "field"),
    [
        ("nope", PAIR, (0,), "model"),
        ("answer_match", {"response": "x"}, (0,), "inputs.reference"),
        ("answer_match", PAIR, (1, 2), "gpus"),
        ("answer_match", PAIR, (7,), "gpus"),
        ("answer_match", PAIR, (), "gpus"),
        ("answer_match", {"response": b"\xff", "reference": "1"}, (0,), "inputs"),
    ],
)
def test_bad_requests_are_validation_errors(
    executor: RewardExecutor, model: str, inputs: dict[str, object], gpus: Chunk, field: str
) -> None:
    with pytest.raises(ValidationError) as info:
        executor.run(model, inputs, gpus)
    assert info.value.field == field


def test_triton_down_is_a_service_error(repository: Path) -> None:
    executor = RewardExecutor(f"127.0.0.1:{free_port()}", repository, gpu_ids=[0])
    with pytest.raises(ServiceError, match="did not answer"):
        executor.run("answer_match", PAIR, (0,))
    assert executor.manager.residents() == {}
    assert executor.manager.busy() == frozenset()


def test_concurrent_runs_from_threads(executor: RewardExecutor) -> None:
    chunks: list[Chunk] = [(0,), (1,), (2,), (3,), (2, 3)]
    errors: list[BaseException] = []
    outcomes: list[RewardOutcome] = []
    lock = threading.Lock()

    def worker(index: int) -> None:
        for step in range(12):
            chunk = chunks[(index + step) % len(chunks)]
            try:
                outcome = executor.run("answer_match", PAIR, chunk)
            except BaseException as exc:  # noqa: BLE001 - collected for the assertion
                errors.append(exc)
                return
            with lock:
                outcomes.append(outcome)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors
    assert len(outcomes) == 96 and all(o.output == {"reward": 1.0} for o in outcomes)
    assert executor.manager.busy() == frozenset()


def _record_leases(manager: GpuManager, jobs: list[tuple[str, Chunk]], threads: int) -> list[
    tuple[str, Chunk, float, float]
]:
    spans: list[tuple[str, Chunk, float, float]] = []
    lock = threading.Lock()
    queue = list(jobs)

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                model, chunk = queue.pop()
            with manager.lease(model, 64, chunk) as lease:
                start = time.perf_counter()
                time.sleep(0.005)
                end = time.perf_counter()
            with lock:
                spans.append((lease.name, chunk, start, end))

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(120)
    return spans


def _conflicts(spans: list[tuple[str, Chunk, float, float]]) -> list[tuple[str, str]]:
    bad = []
    for i, (name_a, chunk_a, start_a, end_a) in enumerate(spans):
        for name_b, chunk_b, start_b, end_b in spans[i + 1:]:
            shared = set(chunk_a) & set(chunk_b)
            same_batch = name_a == name_b and chunk_a == chunk_b
            if shared and start_a < end_b and start_b < end_a and not same_batch:
                bad.append((name_a, name_b))
    return bad


@pytest.mark.parametrize("batch_same_service", [False, True])
def test_at_most_one_service_per_gpu_at_a_time(
    triton_server: TritonServer, repository: Path, batch_same_service: bool
) -> None:
    executor = make_executor(triton_server, repository, batch_same_service=batch_same_service)
    jobs: list[tuple[str, Chunk]] = [("answer_match", c) for c in [(0,), (0, 1), (1,)] * 8]
    try:
        spans = _record_leases(executor.manager, jobs, threads=6)
    finally:
        executor.close()
    assert len(spans) == len(jobs)
    assert _conflicts(spans) == []
    if not batch_same_service:  # strict: no two actions overlap on a GPU at all
        overlapping = [
            (a, b) for i, a in enumerate(spans) for b in spans[i + 1:]
            if set(a[1]) & set(b[1]) and a[2] < b[3] and b[2] < a[3]
        ]
        assert overlapping == []


def test_same_service_requests_share_a_chunk_as_one_batch(
    triton_server: TritonServer, repository: Path
) -> None:
    executor = make_executor(triton_server, repository)
    try:
        run(executor, (3,))  # resident first, so the batch forms while it runs
        spans = _record_leases(executor.manager, [("answer_match", (3,))] * 40, threads=8)
    finally:
        executor.close()
    overlapping = [
        1 for i, a in enumerate(spans) for b in spans[i + 1:] if a[2] < b[3] and b[2] < a[3]
    ]
    assert overlapping, "no two same-service leases overlapped: batching never happened"
