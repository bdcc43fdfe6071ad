"""The tritonclient wrapper against the real server: repository API, inference, errors."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from tangram_celery.errors import ServiceError, ValidationError
from tangram_celery.processes import free_port
from tangram_celery.reward.repository import ModelSpec, load_repository
from tangram_celery.reward.triton import TritonClient


@pytest.fixture(scope="module")
def answer_match(repository: Path) -> ModelSpec:
    return load_repository(repository)["answer_match"]


def _arrays(spec: ModelSpec, responses: list[str], references: list[str]) -> dict[str, object]:
    arrays, _ = spec.encode({"response": responses, "reference": references})
    return arrays


def test_index_lists_the_repository_models(http_client: TritonClient) -> None:
    names = {m["name"] for m in http_client.index()}
    assert {"answer_match", "semantic_similarity"} <= names


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_explicit_load_infer_unload(
    protocol: str, http_client: TritonClient, grpc_client: TritonClient, answer_match: ModelSpec
) -> None:
    client = http_client if protocol == "http" else grpc_client
    client.load("answer_match")
    try:
        assert client.model_ready("answer_match")
        assert {"name": "answer_match", "version": "1", "state": "READY"} in client.index()
        out = client.infer("answer_match", answer_match,
                           _arrays(answer_match, ["\\boxed{4}", "5"], ["4", "4"]))
        assert out["reward"].reshape(-1).tolist() == [1.0, 0.0]
    finally:
        client.unload("answer_match")
    assert not client.model_ready("answer_match")


def test_load_with_config_override_under_a_new_name(
    http_client: TritonClient, answer_match: ModelSpec
) -> None:
    name = "answer_match__override_test"
    config = answer_match.override(name, [{"kind": "KIND_CPU", "count": 2}], {"note": "x"})
    config["max_batch_size"] = 8
    http_client.load(name, config=config, files=answer_match.files)
    try:
        served = http_client.model_config(name)
        assert served["max_batch_size"] == 8
        assert served["instance_group"][0]["count"] == 2
        assert served["parameters"]["note"] == {"string_value": "x"}
        out = http_client.infer(name, answer_match, _arrays(answer_match, ["1/2"], ["0.5"]))
        assert out["reward"].tolist() == [[1.0]]
        # Loaded from uploaded files: not a repository entry.
        assert name not in {m["name"] for m in http_client.index()}
    finally:
        http_client.unload(name)


def test_a_bad_request_fails_alone_and_clearly(
    http_client: TritonClient, grpc_client: TritonClient, answer_match: ModelSpec
) -> None:
    name = "answer_match__bad_request_test"
    http_client.load(name, answer_match.override(name, [{"kind": "KIND_CPU", "count": 1}]),
                     answer_match.files)
    bad = _arrays(answer_match, ["ok"], ["ok"])
    bad["response"] = np.array([[b"\xff\xfe"]], dtype=np.object_)
    good = _arrays(answer_match, ["42"], ["42"])
    results: list[object] = []

    def call(arrays: dict[str, object]) -> None:
        client = TritonClient(http_client.url)
        try:
            results.append(client.infer(name, answer_match, arrays)["reward"].tolist())
        except ValidationError as exc:
            results.append(exc)
        finally:
            client.close()

    try:
        threads = [threading.Thread(target=call, args=(a,)) for a in [good, bad, good, bad, good]]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        errors = [r for r in results if isinstance(r, ValidationError)]
        assert results.count([[1.0]]) == 3 and len(errors) == 2
        assert all("response[0] is not valid UTF-8" in e.reason for e in errors)
        with pytest.raises(ValidationError, match="invalid request"):
            grpc_client.infer(name, answer_match, bad)
    finally:
        http_client.unload(name)


def test_a_model_that_fails_to_load_is_a_service_error(
    http_client: TritonClient, repository: Path
) -> None:
    spec = load_repository(repository)["semantic_similarity"]
    name = "semantic_similarity__broken_test"
    config = spec.override(name, [{"kind": "KIND_CPU", "count": 1}], {"checkpoint": "/nonexistent"})
    with pytest.raises(ServiceError, match="not a sentence-transformers checkpoint directory"):
        http_client.load(name, config, spec.files)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_triton_down_is_a_clear_service_error(protocol: str, answer_match: ModelSpec) -> None:
    client = TritonClient(f"127.0.0.1:{free_port()}", protocol)  # type: ignore[arg-type]
    assert not client.ready()
    with pytest.raises(ServiceError, match="is the server running"):
        client.load("answer_match")
    with pytest.raises(ServiceError, match=r"tangram_celery\.reward\.server"):
        client.infer("answer_match", answer_match, _arrays(answer_match, ["1"], ["1"]))
