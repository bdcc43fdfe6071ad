"""Property tests over the action schema: any input either parses or raises the project's
ValidationError naming a field; nothing else escapes, whatever the shape or size."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tangram_celery.action import ActionLimits, parse_action
from tangram_celery.errors import ValidationError

LIMITS = ActionLimits(max_payload_bytes=4096, apis=frozenset({"search"}))

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30), st.binary(max_size=10),
)
json_like = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(st.text(max_size=10), children, max_size=5),
        st.sets(st.integers(), max_size=3),
    ),
    max_leaves=40,
)
amounts = st.one_of(
    scalars,
    st.lists(st.one_of(st.integers(-5, 50), st.floats()), max_size=4),
    st.fixed_dictionaries({"set": st.lists(st.integers(-3, 64), max_size=5)}),
    st.fixed_dictionaries({"min": st.integers(-3, 9), "max": st.integers(-3, 9)}),
    json_like,
)
costs = st.one_of(
    st.dictionaries(st.sampled_from(["cpu", "gpu", "memory_mb", "api:search", "api:x", "tpu"]),
                    amounts, max_size=4),
    json_like,
)
payloads = st.one_of(
    st.fixed_dictionaries({"code": st.text(max_size=200)}),
    st.fixed_dictionaries({"cmd": st.text(max_size=50)},
                          optional={"files": json_like, "env": json_like}),
    st.fixed_dictionaries({"model": st.text(max_size=10)}, optional={"inputs": json_like}),
    json_like,
)
bodies = st.fixed_dictionaries(
    {},
    optional={
        "id": st.one_of(st.text(max_size=140), scalars),
        "trajectory_id": st.one_of(st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True), scalars),
        "kind": st.one_of(st.sampled_from(["exec", "test_run", "reward", "api"]), scalars),
        "payload": payloads,
        "cost": costs,
        "elasticity": st.one_of(st.sampled_from(["unknown", "linear"]),
                                st.fixed_dictionaries({"amdahl": scalars}),
                                st.fixed_dictionaries({"table": json_like}), json_like),
        "t1": scalars,
        "timeout_s": scalars,
        "signature": scalars,
        "extra": scalars,
    },
)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies)
def test_parse_or_named_validation_error(body: dict[str, Any]) -> None:
    try:
        action = parse_action(body, LIMITS)
    except ValidationError as exc:
        assert exc.field and exc.reason
        assert exc.field in str(exc)
        return
    encoded = json.dumps(action.to_json(), allow_nan=False)
    assert parse_action(encoded, LIMITS) == action
    assert len(action.summary()) < 200


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=300), st.binary(max_size=300)))
def test_raw_text_and_bytes(raw: str | bytes) -> None:
    try:
        parse_action(raw, LIMITS)
    except ValidationError as exc:
        assert exc.field


@settings(max_examples=30, deadline=None)
@given(st.integers(min_value=1, max_value=5000))
def test_deeply_nested_payloads(depth: int) -> None:
    nested: Any = "x"
    for _ in range(depth):
        nested = {"a": [nested]}
    try:
        parse_action({"trajectory_id": "t", "kind": "exec",
                      "payload": {"code": "1", "data": nested}}, LIMITS)
    except ValidationError as exc:
        assert exc.field == "payload"


def test_deep_json_text_is_refused() -> None:
    text = '{"payload": ' + "[" * 100000 + "]" * 100000 + "}"
    try:
        parse_action(text, LIMITS)
    except ValidationError as exc:
        assert exc.field in {"action", "payload", "kind"}
