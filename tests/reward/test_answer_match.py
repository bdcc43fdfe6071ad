"""The rule-based verifier's truth table, scored by the real server in one batched request."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tangram_celery.errors import ValidationError
from tangram_celery.reward.repository import ModelSpec, load_repository
from tangram_celery.reward.triton import TritonClient

TRUTH_TABLE = [
    # (response, reference, reward)
    ("The answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("so we get $\\boxed{\\dfrac{3}{4}}$.", "3/4", 1.0),
    ("\\boxed{\\frac12}", "0.5", 1.0),
    ("Natalia sold 72 clips.\n#### 72", "72", 1.0),
    ("#### 1,000", "1000", 1.0),
    ("The answer is 42.", "42", 1.0),
    ("Answer: x = 3", "3", 1.0),
    ("3.0", "3", 1.0),
    ("1e3", "1000", 1.0),
    ("50\\%", "50", 1.0),
    ("\\boxed{\\text{Blue}}", "blue", 1.0),
    ("  Paris ", "paris", 1.0),
    ("\\boxed{\\left( 1, 2 \\right)}", "(1,2)", 1.0),
    ("0.3333333", "1/3", 1.0),
    ("\\boxed{3}", "4", 0.0),
    ("The answer is 41.", "42", 0.0),
    ("0.33", "1/3", 0.0),
    ("", "0", 0.0),
    ("London", "Paris", 0.0),
    ("\\boxed{12}", "\\boxed{1/2}", 0.0),
    ("no final answer here", "7", 0.0),
]


@pytest.fixture(scope="module")
def loaded(triton_server: object, repository: Path) -> Iterator[tuple[TritonClient, ModelSpec]]:
    client = TritonClient(triton_server.http_url)  # type: ignore[attr-defined]
    client.load("answer_match")
    yield client, load_repository(repository)["answer_match"]
    client.unload("answer_match")
    client.close()


def test_truth_table(loaded: tuple[TritonClient, ModelSpec]) -> None:
    client, spec = loaded
    responses = [row[0] for row in TRUTH_TABLE]
    references = [row[1] for row in TRUTH_TABLE]
    arrays, single = spec.encode({"response": responses, "reference": references})
    got = spec.decode(client.infer("answer_match", spec, arrays), single)["reward"]
    mismatches = [
        (row, value) for row, value in zip(TRUTH_TABLE, got, strict=True) if value != row[2]
    ]
    assert not mismatches


def test_scores_are_deterministic(loaded: tuple[TritonClient, ModelSpec]) -> None:
    client, spec = loaded
    arrays, _ = spec.encode({"response": ["\\boxed{2}"] * 64, "reference": ["2"] * 64})
    first = client.infer("answer_match", spec, arrays)["reward"].tolist()
    assert first == client.infer("answer_match", spec, arrays)["reward"].tolist()
    assert first == [[1.0]] * 64


def test_one_batch_of_many_requests_keeps_rows_and_errors_apart(
    triton_server: object, repository: Path
) -> None:
    """Requests of different sizes, two of them malformed, merged into one execution (a long
    queue delay holds them together): each good one gets exactly its own rows' rewards."""
    spec = load_repository(repository)["answer_match"]
    name = "answer_match__one_batch_test"
    config = spec.override(name, [{"kind": "KIND_CPU", "count": 1}])
    config["dynamic_batching"] = {"max_queue_delay_microseconds": 400_000}
    http_url = triton_server.http_url  # type: ignore[attr-defined]
    admin = TritonClient(http_url)
    admin.load(name, config=config, files=spec.files)
    slices = [TRUTH_TABLE[0:1], TRUTH_TABLE[1:6], None, TRUTH_TABLE[6:14], None,
              TRUTH_TABLE[14:21]]
    results: dict[int, object] = {}

    def call(index: int) -> None:
        rows = slices[index] or [("ok", "ok")]
        arrays, _ = spec.encode({"response": [r[0] for r in rows],
                                 "reference": [r[1] for r in rows]})
        if slices[index] is None:
            arrays["reference"] = np.array([[b"\xff"]], dtype=np.object_)
        client = TritonClient(http_url)
        try:
            results[index] = client.infer(name, spec, arrays)["reward"].reshape(-1).tolist()
        except ValidationError as exc:
            results[index] = exc
        finally:
            client.close()

    try:
        threads = [threading.Thread(target=call, args=(k,)) for k in range(len(slices))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        with urllib.request.urlopen(f"http://{http_url}/v2/models/{name}/stats") as reply:
            stats = json.load(reply)["model_stats"][0]
    finally:
        admin.unload(name)
        admin.close()
    assert stats["execution_count"] < len(slices)  # some requests did share an execution
    for index, rows in enumerate(slices):
        if rows is None:
            error = results[index]
            assert isinstance(error, ValidationError)
            assert "reference[0] is not valid UTF-8" in error.reason
        else:
            assert results[index] == [row[2] for row in rows]
