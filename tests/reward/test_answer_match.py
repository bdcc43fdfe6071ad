"""The rule-based verifier's truth table, scored by the real server in one batched request."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tangram_celery.reward.triton import ModelSpec, TritonClient, load_repository

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
