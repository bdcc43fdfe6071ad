"""The model repository as the single source of tensors, batching and placement overrides."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tangram_celery.errors import ServiceError, ValidationError
from tangram_celery.managers.gpu import instance_group
from tangram_celery.reward.repository import ModelSpec, load_repository, read_config


@pytest.fixture(scope="module")
def specs(repository: Path) -> dict[str, ModelSpec]:
    return load_repository(repository)


def test_repository_has_a_learned_and_a_rule_based_reward(specs: dict[str, ModelSpec]) -> None:
    assert {"semantic_similarity", "answer_match"} <= set(specs)
    for spec in specs.values():
        assert spec.config["backend"] == "python"
        assert [t.name for t in spec.inputs] == ["response", "reference"]
        assert [(t.name, t.datatype) for t in spec.outputs] == [("reward", "FP32")]
        assert spec.max_batch_size > 1
        assert "dynamic_batching" in spec.config
        assert set(spec.files) == {"file:1/model.py"}
        assert spec.dops == (1, 2, 4, 8)


def test_every_config_declares_what_its_model_py_checks(repository: Path) -> None:
    for directory in repository.iterdir():
        if not (directory / "config.pbtxt").is_file():
            continue
        config = read_config(directory / "config.pbtxt")
        code = (directory / "1" / "model.py").read_text()
        for tensor in config["input"] + config["output"]:
            assert f'"{tensor["name"]}": "{tensor["data_type"]}"' in code


def test_override_places_instances_on_real_gpus(specs: dict[str, ModelSpec]) -> None:
    spec = specs["semantic_similarity"]
    config = spec.override("ss__dop2__g4", instance_group((4, 5), simulated=False),
                           {"tangram_gpus": "4,5"})
    assert config["name"] == "ss__dop2__g4"
    assert config["instance_group"] == [{"kind": "KIND_GPU", "count": 1, "gpus": [4, 5]}]
    assert config["parameters"]["tangram_gpus"] == {"string_value": "4,5"}
    assert "checkpoint" in config["parameters"]  # empty: proto3 JSON leaves the value out
    assert spec.config["name"] == "semantic_similarity"  # the spec itself is untouched


def test_override_can_drop_dynamic_batching(specs: dict[str, ModelSpec]) -> None:
    config = specs["answer_match"].override("x", [{"kind": "KIND_CPU", "count": 1}],
                                            dynamic_batching=False)
    assert "dynamic_batching" not in config


def test_encode_builds_one_row_per_pair(specs: dict[str, ModelSpec]) -> None:
    arrays, single = specs["answer_match"].encode({"response": "4", "reference": "4"})
    assert single and arrays["response"].shape == (1, 1)
    assert arrays["response"].dtype == np.object_ and arrays["response"][0, 0] == b"4"
    arrays, single = specs["answer_match"].encode({"response": ["a", "b"], "reference": ["a", "c"]})
    assert not single and arrays["reference"].shape == (2, 1)


def test_decode_gives_json_values(specs: dict[str, ModelSpec]) -> None:
    spec = specs["answer_match"]
    reward = np.array([[1.0], [0.0]], dtype=np.float32)
    assert spec.decode({"reward": reward[:1]}, single=True) == {"reward": 1.0}
    assert spec.decode({"reward": reward}, single=False) == {"reward": [1.0, 0.0]}


@pytest.mark.parametrize(
    ("inputs", "field"),
    [
        ({"response": "a"}, "inputs.reference"),
        ({"response": "a", "reference": "b", "extra": 1}, "inputs.extra"),
        ({"response": 3, "reference": "b"}, "inputs.response"),
        ({"response": [], "reference": []}, "inputs.response"),
        ({"response": ["a", "b"], "reference": ["a"]}, "inputs"),
        ({"response": ["a"], "reference": "a"}, "inputs"),
        ({"response": ["a"] * 300, "reference": ["a"] * 300}, "inputs.response"),
        ("not a mapping", "inputs"),
    ],
)
def test_bad_inputs_name_their_field(
    specs: dict[str, ModelSpec], inputs: object, field: str
) -> None:
    with pytest.raises(ValidationError) as info:
        specs["answer_match"].encode(inputs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_a_broken_config_is_a_service_error(tmp_path: Path) -> None:
    model = tmp_path / "broken"
    model.mkdir()
    (model / "config.pbtxt").write_text("name: 'broken' max_batch_size: nope")
    with pytest.raises(ServiceError, match="not a valid Triton model config"):
        load_repository(tmp_path)
