"""The GPU reward pool end to end, and its pure pieces.

End to end (``slow``) on real parts: a real Redis, the real tritonserver of nvidia-pytriton on
``triton_models/``, real GPU pool worker processes, and reward actions submitted through the
client. **This machine has no GPU: the pool's GPU ids are simulated** (each id of a chunk is one
CPU instance of the model on the real server).
"""

from __future__ import annotations

import itertools
import json
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis
from result_checks import check_act  # the CPU path's ACT checks hold for rewards too

from tangram_celery import keys
from tangram_celery.action import ActionResult, parse_action
from tangram_celery.client import TangramClient, code_action
from tangram_celery.errors import ConfigError, ServiceError, ValidationError
from tangram_celery.managers.gpu import Chunk, Resident
from tangram_celery.pools.admission import Grant, PoolState, Request
from tangram_celery.pools.gpu_pool import (
    GpuPoolRuntime,
    best_fit_chunks,
    gpu_counts,
    reward_action,
    steer_grants,
    worker_name,
)
from tangram_celery.pools.launch import spawn_gpu_worker, wait_for_worker
from tangram_celery.pools.placement import elastic_policy, gpu_pool_factory
from tangram_celery.processes import free_port, stop_process
from tangram_celery.reward.executor import RewardOutcome
from tangram_celery.reward.repository import ModelSpec, load_repository
from tangram_celery.reward.server import TritonServer
from tangram_celery.settings import Settings
from tangram_celery.tasks.app import make_app

REPOSITORY = Path(__file__).resolve().parents[3] / "triton_models"
GUITAR = "A man is playing a guitar."
PARAPHRASE = "Someone is playing an instrument."
UNRELATED = "The stock market fell sharply today."
TRUTH = [
    ("The answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("Natalia sold 72 clips.\n#### 72", "72", 1.0),
    ("The answer is 41.", "42", 0.0),
    ("\\boxed{3}", "4", 0.0),
    ("1e3", "1000", 1.0),
    ("London", "Paris", 0.0),
]


# --------------------------------------------------------------------------- pure pieces


def test_gpu_counts_keep_what_the_model_and_the_pool_serve() -> None:
    assert gpu_counts(range(1, 9), (1, 2, 4, 8), 8) == (1, 2, 4, 8)
    assert gpu_counts(range(1, 9), (1, 2, 4, 8), 4) == (1, 2, 4)
    assert gpu_counts((2, 8), (1, 2), 8) == (2,)
    for allowed in [(3,), (16,), (0,), (5, 6, 7)]:
        with pytest.raises(ValidationError) as info:
            gpu_counts(allowed, (1, 2, 4, 8), 8)
        assert info.value.field == "cost.gpu"


def test_best_fit_chunks_are_every_aligned_piece_of_the_smallest_fitting_chunks() -> None:
    assert best_fit_chunks(range(8), 8, 8, 1) == [(u,) for u in range(8)]
    assert best_fit_chunks((1, 2, 3), 4, 4, 1) == [(1,)]
    assert best_fit_chunks((1, 2, 3), 4, 4, 2) == [(2, 3)]
    assert best_fit_chunks((0, 1, 4, 5, 6, 7), 8, 8, 2) == [(0, 1)]
    assert best_fit_chunks((1, 2, 3), 4, 4, 4) == []
    assert best_fit_chunks(range(8), 8, 4, 4) == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_steering_moves_a_grant_onto_the_preferred_chunk() -> None:
    grants: list[Grant] = [("a", (0,))]
    assert steer_grants(grants, range(4), 4, 4, lambda _, c: c[-1]) == [("a", (3,))]
    assert steer_grants(grants, range(4), 4, 4, lambda _, c: (9,)) == [("a", (0,))]


def test_steered_grants_stay_feasible_aligned_and_disjoint() -> None:
    rng = random.Random(7)
    policy = elastic_policy("p", gpu_pool_factory("p", 8))
    for trial in range(300):
        total = rng.choice([4, 8, 16])
        free = tuple(sorted(rng.sample(range(total), rng.randint(1, total))))
        waiting = tuple(
            request(f"j{trial}-{k}", rng.choice([(1,), (2,), (1, 2, 4), (4, 8)]), rng)
            for k in range(rng.randint(1, 6))
        )
        grants = policy(PoolState(waiting, free, (), total, 10.0))
        steered = steer_grants(grants, free, total, min(8, total),
                               lambda _, c: c[rng.randrange(len(c))])
        assert [(g, len(u)) for g, u in steered] == [(g, len(u)) for g, u in grants]
        taken = [u for _, units in steered for u in units]
        assert len(taken) == len(set(taken)) and set(taken) <= set(free)
        for _, units in steered:
            assert units == tuple(range(units[0], units[0] + len(units)))
            assert units[0] % len(units) == 0


def request(action_id: str, counts: Sequence[int], rng: random.Random) -> Request:
    t1 = rng.uniform(0.5, 4.0)
    return Request(action_id, tuple((m, t1 / m) for m in counts), rng.uniform(0, 10))


class FakeExecutor:
    """The repository's real specs, no server: runs return a canned outcome or raise."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.specs: Mapping[str, ModelSpec] = load_repository(REPOSITORY)
        self.fail = fail
        self.runs: list[tuple[str, tuple[int, ...]]] = []
        self.residents_loaded: list[Resident] = []

    def models(self) -> list[str]:
        return sorted(self.specs)

    def spec(self, model: str) -> ModelSpec:
        if model not in self.specs:
            raise ValidationError("model", f"unknown reward model {model!r}")
        return self.specs[model]

    def ready(self) -> bool:
        return True

    def residents(self) -> list[tuple[str, Chunk]]:
        return [("answer_match", gpus) for _, gpus in self.runs]

    def loaded(self) -> list[Resident]:
        return list(self.residents_loaded)

    def rank_chunks(self, model: str, chunks: Sequence[Chunk]) -> list[Chunk]:
        return sorted(chunks, reverse=True)  # prefer the highest ids, to see steering act

    def run(self, model: str, inputs: Mapping[str, Any], gpus: tuple[int, ...]) -> RewardOutcome:
        self.runs.append((model, gpus))
        if self.fail is not None:
            raise self.fail
        started = time.time()
        time.sleep(0.003)
        return RewardOutcome({"reward": 1.0}, exec_s=0.002, setup_s=0.5, loaded=True,
                             evicted=["x"], triton_model=f"{model}@{gpus}",
                             started_at=started, finished_at=time.time())

    def close(self, unload: bool = True) -> list[str]:
        return []


def fake_runtime(fail: Exception | None = None, gpus: int = 8, scheduler: str = "elastic",
                 client: redis.Redis | None = None) -> tuple[GpuPoolRuntime, FakeExecutor]:
    executor = FakeExecutor(fail)
    settings = Settings.from_env({}, scheduler=scheduler)
    runtime = GpuPoolRuntime(settings, "unit", executor, range(gpus), 8, name="w1",
                             client=client)
    return runtime, executor


def message(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "trajectory_id": "t", "kind": "reward",
        "payload": {"model": "answer_match", "inputs": {"response": "7", "reference": "7"}},
        "cost": {"gpu": 1},
    }
    body.update(fields)
    return parse_action(body).to_json()


def test_runtime_result_carries_outputs_serving_info_and_timings() -> None:
    runtime, executor = fake_runtime()
    result = ActionResult.from_json(runtime.execute(message(), time.time()))
    assert executor.runs == [("answer_match", (7,))]
    assert result.status == "ok" and result.units == (7,), "steered to the backend's favourite"
    assert result.output["reward"] == 1.0 and result.output["loaded"] is True
    assert result.output["evicted"] == ["x"] and result.output["simulated_gpus"] is True
    assert result.timings.setup_s == 0.5 and result.timings.exec_s == 0.002
    t = result.timings
    assert t.received <= t.admitted <= t.exec_started <= t.exec_finished <= t.stored
    assert runtime.admission.free_count() == 8
    assert runtime.durations.known(("reward", "answer_match"))


def test_the_default_scheduler_runs_an_action_where_its_service_is_resident() -> None:
    """TANGRAM_SCHEDULER=robust: the service-aware scheduler sees answer_match resident on
    GPU 13 of a pool of GPU ids 10..17 (unit 3) and runs the action there; the paper's
    allocator, steered, takes the backend's favourite (the highest id) instead."""
    for scheduler, expected in (("robust", (13,)), ("elastic", (17,))):
        executor = FakeExecutor()
        executor.residents_loaded = [
            Resident("unit__answer_match__dop1__g13", "answer_match", (13,), 64, 1)]
        runtime = GpuPoolRuntime(Settings.from_env({}, scheduler=scheduler), "unit", executor,
                                 range(10, 18), 8, name="w1")
        result = ActionResult.from_json(runtime.execute(message(), time.time()))
        assert result.status == "ok" and result.units == expected, scheduler


def test_a_grant_that_restores_is_expected_to_end_later_by_the_restore() -> None:
    runtime, executor = fake_runtime(scheduler="robust")
    assert runtime.expected_restore_s("answer_match", (3,)) == runtime.settings.gpu.restore_s
    executor.residents_loaded = [
        Resident("unit__answer_match__dop1__g3", "answer_match", (3,), 64, 1)]
    assert runtime.expected_restore_s("answer_match", (3,)) == 0.0
    assert runtime.expected_restore_s("answer_match", (4,)) == runtime.settings.gpu.restore_s


def test_the_pool_learns_restore_times_and_shows_them_to_its_scheduler() -> None:
    runtime, _ = fake_runtime(scheduler="robust")
    before = {s.name: s for s in runtime.residency().services}["answer_match"]
    assert before.restore_at(1) is None and before.memory_at(1) > 0
    runtime.execute(message(), time.time())
    runtime.execute(message(), time.time())
    after = {s.name: s for s in runtime.residency().services}["answer_match"]
    assert after.restore_at(1) == pytest.approx(0.5), "FakeExecutor's loads take 0.5 s"
    assert runtime.residency().memory_mb == runtime.settings.gpu.memory_mb


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"kind": "exec", "payload": {"cmd": "true"}, "cost": {"cpu": 1}}, "do not run on GPU"),
        ({"payload": {"model": "nope", "inputs": {}}}, "unknown reward model 'nope'"),
        ({"payload": {"model": "answer_match", "inputs": {"response": "7"}}},
         "inputs.reference"),
        ({"payload": {"model": "answer_match", "inputs": {}, "x": 1}}, "payload.x"),
        ({"cost": {"gpu": 3}}, "cost.gpu"),
        ({"cost": {"gpu": 16}}, "cost.gpu"),
    ],
)
def test_runtime_rejects_what_it_cannot_run(fields: dict[str, Any], reason: str) -> None:
    runtime, executor = fake_runtime()
    body = message()
    body.update(fields)
    result = runtime.execute(body, time.time())
    assert result["status"] == "rejected" and reason in result["error"], result["error"]
    assert executor.runs == []


@pytest.mark.parametrize(
    ("error", "status"),
    [(ServiceError("Triton did not answer"), "error"), (ValidationError("inputs", "bad"),
                                                         "rejected")],
)
def test_runtime_releases_gpus_when_a_run_fails(error: Exception, status: str) -> None:
    runtime, _ = fake_runtime(fail=error)
    result = runtime.execute(message(cost={"gpu": [1, 8]}), time.time())
    assert result["status"] == status and str(error) in result["error"]
    assert runtime.admission.free_count() == 8


def test_request_options_follow_t1_elasticity_the_model_and_the_scheduler() -> None:
    runtime, _ = fake_runtime()
    elastic = parse_action(message(cost={"gpu": {"set": [1, 2, 4, 8]}}, t1=4.0,
                                   elasticity="linear"))
    assert runtime.request(elastic, "answer_match", (1, 2, 4, 8), 0.0).options == (
        (1, 4.0), (2, 2.0), (4, 1.0), (8, 0.5))
    fixed = parse_action(message(cost={"gpu": [1, 8]}))
    assert runtime.request(fixed, "answer_match", (1, 2, 4, 8), 0.0).options == ((1, None),)
    for units, seconds in [(1, 4.0), (2, 2.1), (4, 1.2)] * 3:
        runtime.durations.observe(("reward", "answer_match"), units, seconds)
    learned = parse_action(message(cost={"gpu": [1, 4]}, elasticity="linear"))
    options = dict(runtime.request(learned, "answer_match", (1, 2, 4), 0.0).options)
    assert options[1] == pytest.approx(4.0, rel=0.1) and options[4] == pytest.approx(1.2, rel=0.2)
    fcfs, _ = fake_runtime(scheduler="fcfs-min")
    assert fcfs.request(elastic, "answer_match", (1, 2, 4, 8), 0.0).options == ((1, 4.0),)


def test_the_pool_publishes_its_inventory_and_withdraws_it(redis_client: redis.Redis) -> None:
    runtime, _ = fake_runtime(client=redis_client)
    runtime.publish()
    runtime.execute(message(), time.time())
    runtime.publish()
    raw = redis_client.hgetall(keys.gpu_pool("unit"))
    fields = {k.decode(): v.decode() for k, v in raw.items()}
    assert redis_client.smembers(keys.GPU_POOLS) == {b"unit"}
    assert (fields["gpus"], fields["free_gpus"], fields["worker"]) == ("8", "8", "w1")
    assert "semantic_similarity" in json.loads(fields["models"])
    assert json.loads(fields["residents"]) == [{"model": "answer_match", "gpus": [7]}]
    assert time.time() - float(fields["heartbeat"]) < 5
    redis_client.hset(keys.gpu_pool("unit"), "worker", "someone-else")
    runtime.withdraw()
    assert redis_client.exists(keys.gpu_pool("unit")), "another worker's record stays"
    redis_client.hset(keys.gpu_pool("unit"), "worker", "w1")
    runtime.withdraw()
    assert not redis_client.exists(keys.gpu_pool("unit"))
    assert redis_client.smembers(keys.GPU_POOLS) == set()


def test_pool_shapes_are_checked() -> None:
    executor = FakeExecutor()
    settings = Settings.from_env({})
    for gpus, node_size in [(6, 8), (12, 8), (8, 3)]:
        with pytest.raises(ConfigError):
            GpuPoolRuntime(settings, "p", executor, range(gpus), node_size)
    with pytest.raises(ConfigError):
        GpuPoolRuntime(settings, "bad name", executor, range(4), 4)
    assert GpuPoolRuntime(settings, "p", executor, range(4), 8).node_size == 4


# --------------------------------------------------------------------------- end to end

GpuWorkers = Callable[..., str]


@pytest.fixture()
def gpu_workers(
    settings: Settings, triton_server: TritonServer, tmp_path: Path
) -> Iterator[GpuWorkers]:
    """Start real GPU pool worker processes: ``gpu_workers("pool", gpus, **TANGRAM_env)``."""
    app = make_app(settings)
    started: list[Any] = []

    def start(pool: str, gpus: int, *args: str, **env: str) -> str:
        base = {"TANGRAM_REDIS_URL": settings.broker.redis_url,
                "TANGRAM_TRITON_URL": triton_server.http_url,
                "TANGRAM_TRITON_REPOSITORY": str(REPOSITORY), **env}
        process = spawn_gpu_worker(base, pool, gpus, tmp_path / f"gpu-{pool}.log", args)
        started.append(process)
        name = worker_name(pool, process.pid)
        wait_for_worker(app, name, process)
        return name

    yield start
    for process in started:
        stop_process(process, timeout=30)
    for log in sorted(tmp_path.glob("gpu-*.log")):
        text = log.read_text(errors="replace")
        if "Traceback" in text:
            print(f"--- {log.name} ---\n{text[-4000:]}")


def aligned(units: Sequence[int]) -> bool:
    size = len(units)
    return (size & (size - 1)) == 0 and units[0] % size == 0 and \
        tuple(units) == tuple(range(units[0], units[0] + size))


def check_exclusive(results: Sequence[ActionResult]) -> int:
    """No two actions held a GPU id at the same time, except members of one service batch (same
    chunk and service, one of them joined); returns how many pairs overlapped."""
    overlapping = 0
    for a, b in itertools.combinations(results, 2):
        if a.timings.admitted < b.timings.exec_finished \
                and b.timings.admitted < a.timings.exec_finished:
            overlapping += 1
            if a.units == b.units and a.output["service"] == b.output["service"] \
                    and (a.output["joined"] or b.output["joined"]):
                continue
            assert not set(a.units) & set(b.units), (a.action_id, b.action_id, a.units)
    return overlapping


def am(response: str, reference: str, pool: str, **fields: Any) -> Any:
    return reward_action("traj-r", "answer_match", {"response": response, "reference": reference},
                         pool=pool, **fields)


@pytest.mark.slow
def test_answer_match_results_are_correct_in_order_with_act(
    settings: Settings, gpu_workers: GpuWorkers
) -> None:
    node = gpu_workers("order", 4)
    actions = [am(r, ref, "order") for r, ref, _ in TRUTH * 3]
    with TangramClient(settings) as client:
        handles = client.submit_many(actions)
        results = [h.result(timeout=120) for h in handles]
    assert {h.queue for h in handles} == {keys.gpu_queue("order")}
    assert [r.action_id for r in results] == [a.id for a in actions]
    for (_, _, want), result in zip(TRUTH * 3, results, strict=True):
        assert result.ok, (result.status, result.error)
        assert result.output["reward"] == want and result.node == node
        assert len(result.units) == 1 and result.output["simulated_gpus"] is True
        assert result.output["service"].startswith("order__answer_match__dop1__g")
        check_act(result)
    loads = [r for r in results if r.output["loaded"]]
    assert loads and all(r.timings.setup_s > 0 for r in loads)
    assert check_exclusive(results) >= 0
    published = wait_for_residents(settings, "order")
    assert published["worker"] == node and published["gpus"] == "4"
    assert {r["model"] for r in json.loads(published["residents"])} == {"answer_match"}


def wait_for_residents(settings: Settings, pool: str, timeout: float = 10.0) -> dict[str, str]:
    """The pool's published inventory once it lists a resident service."""
    client = redis.Redis.from_url(settings.broker.redis_url, decode_responses=True)
    deadline = time.monotonic() + timeout
    try:
        while True:
            fields = client.hgetall(keys.gpu_pool(pool))
            if json.loads(fields.get("residents", "[]")) or time.monotonic() > deadline:
                return dict(fields)
            time.sleep(0.2)
    finally:
        client.close()


@pytest.mark.slow
def test_semantic_similarity_scores_and_resident_chunks_win(
    settings: Settings, gpu_workers: GpuWorkers
) -> None:
    gpu_workers("sem", 2, TANGRAM_GPU_MEMORY_MB="520")  # MiniLM (512 MB) or answer_match per GPU

    def sem(reference: str) -> Any:
        return reward_action("traj-s", "semantic_similarity",
                             {"response": GUITAR, "reference": reference}, pool="sem")

    with TangramClient(settings) as client:
        results = [client.submit(sem(ref)).result(timeout=240)
                   for ref in (PARAPHRASE, UNRELATED, GUITAR)]
        verifier = client.submit(am("7", "7", "sem")).result(timeout=120)
        again = client.submit(sem(PARAPHRASE)).result(timeout=120)
    assert all(r.ok for r in [*results, verifier, again]), [r.error for r in results]
    paraphrase, unrelated, same = (r.output["reward"] for r in results)
    assert paraphrase > unrelated + 0.3 and same == pytest.approx(1.0, abs=1e-3)
    first = results[0]
    assert first.output["loaded"] and first.timings.setup_s > first.timings.exec_s
    assert first.act["overhead"] >= first.timings.setup_s, "loading counts as overhead"
    assert [r.units for r in results] == [(0,)] * 3
    assert [r.output["loaded"] for r in results] == [True, False, False]
    # GPU 0 holds MiniLM: the verifier goes to GPU 1 instead of evicting it (the lowest-id
    # choice would have been GPU 0), and MiniLM then runs again where it is resident.
    assert verifier.units == (1,) and verifier.output["evicted"] == []
    assert again.units == (0,) and not again.output["loaded"]
    assert again.output["reward"] == pytest.approx(paraphrase, abs=1e-4)


@pytest.mark.slow
def test_concurrent_actions_never_share_a_gpu(settings: Settings,
                                              gpu_workers: GpuWorkers) -> None:
    gpu_workers("excl", 4, "--concurrency", "12")
    costs: list[Any] = [1, 2, 1, [1, 2], 4, 1, 2, 1]
    actions = [am(r, ref, "excl", cost={"gpu": costs[k % len(costs)]})
               for k, (r, ref, _) in enumerate(TRUTH * 4)]
    with TangramClient(settings) as client:
        results = client.run_batch(actions, timeout=240)
    assert all(r.ok for r in results), [(r.status, r.error) for r in results]
    assert [r.output["reward"] for r in results] == [want for _, _, want in TRUTH * 4]
    for result in results:
        assert aligned(result.units) and max(result.units) < 4
    assert check_exclusive(results) > 0, "nothing ran concurrently: the check proved nothing"


@pytest.mark.slow
def test_an_elastic_reward_gets_more_than_one_gpu_on_an_idle_pool(
    settings: Settings, gpu_workers: GpuWorkers
) -> None:
    gpu_workers("elastic", 8)
    rows = {"response": [r for r, _, _ in TRUTH], "reference": [ref for _, ref, _ in TRUTH]}
    elastic = reward_action("traj-e", "answer_match", rows, pool="elastic",
                            gpu={"set": [1, 2, 4, 8]}, t1=2.0, elasticity={"amdahl": 0.95})
    fixed = reward_action("traj-e", "answer_match", rows, pool="elastic", gpu=[1, 8])
    with TangramClient(settings) as client:
        first = client.submit(elastic).result(timeout=120)
        second = client.submit(fixed).result(timeout=120)
    assert first.ok and second.ok, (first.error, second.error)
    assert len(first.units) > 1 and aligned(first.units), first.units
    assert first.output["service"].endswith(f"__dop{len(first.units)}__g{first.units[0]}")
    assert first.output["reward"] == [want for _, _, want in TRUTH]
    assert len(second.units) == 1, "no elasticity declared: its minimum"


@pytest.mark.slow
def test_evict_on_execution_and_resident_chunks_win(
    settings: Settings, gpu_workers: GpuWorkers
) -> None:
    gpu_workers("evict", 2, TANGRAM_GPU_MEMORY_MB="64")  # one answer_match service per GPU
    steps: list[tuple[Any, bool, list[str]]] = [
        (1, True, []),
        (1, False, []),
        (2, True, ["evict__answer_match__dop1__g0"]),
        (1, True, ["evict__answer_match__dop2__g0"]),
        (1, False, []),
    ]
    with TangramClient(settings) as client:
        for gpus, loaded, evicted in steps:
            result = client.submit(am("7", "7", "evict", cost={"gpu": gpus})).result(timeout=120)
            assert result.ok, result.error
            assert (result.output["loaded"], result.output["evicted"]) == (loaded, evicted)
            if not loaded:
                assert result.timings.setup_s < 0.05


def send_raw(client: TangramClient, body: dict[str, Any], pool: str) -> ActionResult:
    """Publish a message straight to a pool's queue, past the client's own checks; its result."""
    client.app.send_task(keys.task_name(str(body["kind"])), args=[body],
                         queue=keys.gpu_queue(pool), task_id=body["id"])
    return ActionResult.from_json(client.app.AsyncResult(body["id"]).get(timeout=60))


@pytest.mark.slow
def test_a_bad_model_is_rejected_and_the_worker_carries_on(
    settings: Settings, gpu_workers: GpuWorkers
) -> None:
    gpu_workers("bad", 2)
    bad = reward_action("traj-b", "no_such_model", {"response": "1"}, pool="bad")
    too_many = am("1", "1", "bad", cost={"gpu": 4})
    odd = am("1", "1", "bad", cost={"gpu": 3})
    wrong_kind = code_action("traj-b", "print(1)")
    with TangramClient(settings) as client:
        results = [send_raw(client, a.to_json(), "bad") for a in (bad, too_many, odd, wrong_kind)]
        good = client.submit(am("1", "1", "bad")).result(timeout=60)
    assert [r.status for r in results] == ["rejected"] * 4, [r.error for r in results]
    assert "unknown reward model 'no_such_model'" in results[0].error
    assert "answer_match" in results[0].error, "the error lists the known models"
    assert "cost.gpu" in results[1].error and "[1, 2]" in results[1].error
    assert "cost.gpu" in results[2].error
    assert "do not run on GPU pools" in results[3].error
    assert good.ok and good.output["reward"] == 1.0


@pytest.mark.slow
def test_triton_down_is_a_clear_error_not_a_hang(
    settings: Settings, gpu_workers: GpuWorkers
) -> None:
    gpu_workers("down", 2, "--triton-retry-s", "2",
                TANGRAM_TRITON_URL=f"127.0.0.1:{free_port()}")
    with TangramClient(settings) as client:
        started = time.monotonic()
        results = client.run_batch([am("1", "1", "down"), am("2", "2", "down")], timeout=60)
        waited = time.monotonic() - started
    assert waited < 30
    for result in results:
        assert result.status == "error" and "did not answer" in result.error, result.error
        assert "tangram_celery.reward.server" in result.error, "says how to start a server"
        assert result.units and result.timings.admitted <= result.timings.stored


@pytest.mark.slow
def test_a_pool_over_grpc(settings: Settings, gpu_workers: GpuWorkers,
                          triton_server: TritonServer) -> None:
    gpu_workers("grpc", 2, TANGRAM_TRITON_URL=triton_server.grpc_url,
                TANGRAM_TRITON_PROTOCOL="grpc")
    actions = [am(r, ref, "grpc") for r, ref, _ in TRUTH]
    with TangramClient(settings) as client:
        results = client.run_batch(actions, timeout=120)
    assert [r.output["reward"] for r in results] == [want for _, _, want in TRUTH]
