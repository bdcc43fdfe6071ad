"""The action model: valid forms round-trip, and each kind of bad input has its own error."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest

from tangram_celery.action import (
    ActionLimits,
    ActionResult,
    Elasticity,
    Timings,
    parse_action,
)
from tangram_celery.errors import SerializationError, ValidationError


def base(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "trajectory_id": "traj-1",
        "kind": "exec",
        "payload": {"code": "print(1)"},
        "cost": {"cpu": 1},
    }
    body.update(changes)
    return {k: v for k, v in body.items() if v is not ...}


LIMITS = ActionLimits(max_payload_bytes=1024, max_timeout_s=100, apis=frozenset({"search"}))

INVALID = [
    # (description, body, field, words in the reason)
    ("missing trajectory id", base(trajectory_id=...), "trajectory_id", "missing"),
    ("empty trajectory id", base(trajectory_id=""), "trajectory_id", "missing"),
    ("trajectory id with a slash", base(trajectory_id="../etc"), "trajectory_id", "characters"),
    ("bad action id", base(id="a b"), "id", "characters"),
    ("missing kind", base(kind=...), "kind", "missing"),
    ("unknown kind", base(kind="teleport"), "kind", "unknown kind"),
    ("unknown resource", base(cost={"cpu": 1, "tpu": 2}), "cost.tpu", "unknown resource"),
    ("negative amount", base(cost={"cpu": -1}), "cost.cpu", "negative"),
    ("negative range", base(cost={"cpu": [-2, 4]}), "cost.cpu.min", "negative"),
    ("min > max", base(cost={"cpu": [8, 2]}), "cost.cpu", "min 8 > max 2"),
    ("empty range", base(cost={"cpu": []}), "cost.cpu", "[min, max]"),
    ("three-value range", base(cost={"cpu": [1, 2, 3]}), "cost.cpu", "[min, max]"),
    ("empty set", base(cost={"cpu": {"set": []}}), "cost.cpu", "non-empty"),
    ("fractional cores", base(cost={"cpu": 1.5}), "cost.cpu", "whole number"),
    ("zero cores", base(cost={"cpu": 0}), "cost.cpu", "at least 1 core"),
    ("string amount", base(cost={"cpu": "4"}), "cost.cpu", "expected a number"),
    ("nan amount", base(cost={"memory_mb": float("nan")}), "cost.memory_mb", "expected a number"),
    ("bool amount", base(cost={"cpu": True}), "cost.cpu", "expected a number"),
    ("cost not an object", base(cost=[1]), "cost", "expected an object"),
    ("undeclared api", base(kind="api", payload={}, cost={"api:maps": 1}), "cost.api:maps",
     "unknown resource"),
    ("api action without api", base(kind="api", payload={}, cost={"cpu": 1}), "cost", "api:"),
    ("gpu on a cpu kind", base(cost={"gpu": 1}), "cost.gpu", "reward"),
    ("payload too large", base(payload={"code": "x" * 2000}), "payload", "exceeds"),
    ("payload not an object", base(payload="print(1)"), "payload", "JSON object"),
    ("payload with bytes", base(payload={"code": "1", "blob": b"\x00"}), "payload",
     "not JSON-serializable"),
    ("payload with a set", base(payload={"code": "1", "tags": {1, 2}}), "payload",
     "not JSON-serializable"),
    ("payload with nan", base(payload={"code": "1", "x": float("inf")}), "payload",
     "not JSON-serializable"),
    ("neither cmd nor code", base(payload={"files": {}}), "payload", "exactly one"),
    ("both cmd and code", base(payload={"cmd": "ls", "code": "1"}), "payload", "exactly one"),
    ("blank code", base(payload={"code": "  "}), "payload.code", "non-empty"),
    ("malleable not a flag", base(payload={"cmd": "pytest", "malleable": "yes"}),
     "payload.malleable", "true or false"),
    ("absolute file path", base(payload={"code": "1", "files": {"/etc/x": "y"}}),
     "payload.files./etc/x", "relative"),
    ("dotdot file path", base(payload={"code": "1", "files": {"a/../../x": "y"}}),
     "payload.files.a/../../x", "relative"),
    ("bad env name", base(payload={"code": "1", "env": {"A-B": "1"}}), "payload.env", "NAME"),
    ("reward without model", base(kind="reward", payload={}, cost={"gpu": 1}), "payload.model",
     "model"),
    ("elasticity out of range", base(elasticity={"amdahl": 1.5}), "elasticity.amdahl", "[0, 1]"),
    ("elasticity zero entry", base(elasticity={"table": {"2": 0}}), "elasticity.table.2",
     "(0, 1]"),
    ("elasticity unknown form", base(elasticity="fast"), "elasticity", "expected"),
    ("negative t1", base(t1=-1), "t1", "positive"),
    ("timeout too long", base(timeout_s=1000), "timeout_s", "TANGRAM_MAX_TIMEOUT_S"),
    ("zero timeout", base(timeout_s=0), "timeout_s", "positive"),
    ("unknown field", base(priority=1), "priority", "unknown field"),
]


@pytest.mark.parametrize(("name", "body", "field", "reason"), INVALID, ids=[c[0] for c in INVALID])
def test_each_bad_input_names_field_and_reason(
    name: str, body: dict[str, Any], field: str, reason: str
) -> None:
    with pytest.raises(ValidationError) as info:
        parse_action(body, LIMITS)
    assert info.value.field == field, name
    assert reason in info.value.reason, info.value.reason
    assert field in str(info.value)


def test_non_json_text_is_a_serialization_error() -> None:
    with pytest.raises(SerializationError) as info:
        parse_action("{not json", LIMITS)
    assert info.value.field == "action"


def test_pickle_bytes_are_refused() -> None:
    blob = pickle.dumps(base())
    with pytest.raises(SerializationError):
        parse_action(blob, LIMITS)


def test_not_an_object() -> None:
    with pytest.raises(ValidationError, match="expected a JSON object"):
        parse_action([1, 2], LIMITS)


VALID_COSTS = [
    ({"cpu": 2}, (2,), False),
    ({"cpu": [1, 4]}, (1, 2, 3, 4), True),
    ({"cpu": {"min": 2, "max": 3}}, (2, 3), True),
    ({"cpu": {"set": [4, 1, 2, 2]}}, (1, 2, 4), True),
    ({"cpu": [3, 3], "memory_mb": 256.5}, (3,), False),
]


@pytest.mark.parametrize(("cost", "allowed", "elastic"), VALID_COSTS)
def test_cost_forms(cost: dict[str, Any], allowed: tuple[int, ...], elastic: bool) -> None:
    action = parse_action(base(cost=cost), LIMITS)
    assert action.units().allowed_units() == allowed
    assert action.units().elastic is elastic
    again = parse_action(json.loads(json.dumps(action.to_json())), LIMITS)
    assert again == action


def test_round_trip_of_every_optional_field() -> None:
    body = base(kind="test_run", payload={"cmd": "pytest -q", "files": {"t.py": "x"}},
                cost={"cpu": [1, 8], "memory_mb": 128}, elasticity={"amdahl": 0.9}, t1=3.0,
                timeout_s=20, signature="repo-1", submitted_at=1.5, trajectory_memory_mb=300,
                id="abc")
    action = parse_action(body, LIMITS)
    assert parse_action(json.dumps(action.to_json()), LIMITS) == action
    assert action.apis() == ()
    assert "kind=test_run" in action.summary() and "cpu=1-8" in action.summary()


def test_api_action_lists_its_apis() -> None:
    action = parse_action(base(kind="api", payload={"q": 1}, cost={"api:search": 1}), LIMITS)
    assert action.pool == "api" and action.apis() == ("search",)


def test_summary_stays_short_for_huge_payloads() -> None:
    limits = ActionLimits(max_payload_bytes=10**7)
    action = parse_action(base(payload={"code": "x" * 10**6}, trajectory_id="t" * 128), limits)
    assert len(action.summary()) < 100


ELASTICITY = [
    ("linear", 4, 1.0),
    ({"amdahl": 1.0}, 4, 1.0),
    ({"amdahl": 0.0}, 4, 0.25),
    ({"amdahl": 0.5}, 2, (1 / (0.5 + 0.25)) / 2),
    ({"table": {"1": 1.0, "2": 0.9, "4": 0.5}}, 4, 0.5),
    ({"table": {"1": 1.0, "2": 0.9}}, 4, 0.9 * 2 / 4),
]


@pytest.mark.parametrize(("raw", "m", "expected"), ELASTICITY)
def test_elasticity_efficiency(raw: Any, m: int, expected: float) -> None:
    action = parse_action(base(elasticity=raw, t1=8.0), LIMITS)
    assert isinstance(action.elasticity, Elasticity)
    assert action.elasticity.efficiency(m) == pytest.approx(expected)
    assert action.expected_duration(m) == pytest.approx(8.0 / (expected * m))


def test_unknown_elasticity_and_t1() -> None:
    action = parse_action(base(elasticity="unknown"), LIMITS)
    assert action.elasticity is None and action.expected_duration(4) is None


def test_act_parts_add_up() -> None:
    timings = Timings(submitted=100.0, published=100.002, received=100.01, admitted=100.5,
                      exec_started=100.51, exec_finished=101.51, stored=101.52,
                      completed=101.53, exec_s=1.0, setup_s=0.01)
    result = ActionResult("a", "t", "exec", "ok", timings=timings)
    act = result.act
    assert act["queue"] == pytest.approx(0.498)
    assert act["exec"] == pytest.approx(1.0)
    assert act["queue"] + act["exec"] + act["overhead"] == pytest.approx(act["total"])
    assert ActionResult.from_json(json.loads(json.dumps(result.to_json()))).act == act
