"""What a GPU pool expects a call without t1 to take: learned per (model, DoP) (plain data)."""

from __future__ import annotations

import pytest

from tangram_celery.scheduling import DurationModel
from tangram_celery.scheduling.learned import Prior, learn
from tangram_celery.scheduling.service_times import (
    service_key,
    service_options,
    service_signature,
)

PRIOR = Prior(10.0, 0.5)


def amdahl(t1: float, p: float, m: int) -> float:
    return t1 * ((1 - p) + p / m)


@pytest.mark.parametrize(
    ("model", "signature", "key"),
    [
        ("teacher-math", "", "teacher-math"),
        ("teacher-math", "teacher-math", "teacher-math"),
        ("teacher-math", "prompt-7", "teacher-math/prompt-7"),
    ],
)
def test_a_call_is_learned_under_its_model_and_signature(model: str, signature: str,
                                                         key: str) -> None:
    assert service_key(model, signature) == key
    assert service_signature(model, signature) == ("reward", key)


SERVED = {
    "nothing": [],
    "one DoP": [("a", 2, 6.0)],
    "two DoPs": [("a", 1, amdahl(8.0, 0.8, 1)), ("a", 8, amdahl(8.0, 0.8, 8))],
    "another model": [("b", 1, amdahl(4.0, 0.8, 1)), ("b", 4, amdahl(4.0, 0.8, 4))],
}
"""What the pool served: (model, DoP, seconds) per case."""


@pytest.mark.parametrize(
    ("served", "allowed", "elastic", "expected"),
    [
        ("nothing", [1, 2, 4], True, [(1, 10.0), (2, 7.5), (4, 6.25)]),
        ("nothing", [1, 2, 4], False, [(1, None)]),
        ("one DoP", [1, 2, 4], True, [(1, 8.0), (2, 6.0), (4, 5.0)]),
        ("one DoP", [2, 4], False, [(2, 6.0)]),
        ("two DoPs", [1, 2, 4, 8], True, [(m, amdahl(8.0, 0.8, m)) for m in (1, 2, 4, 8)]),
        ("another model", [1, 2, 4], True, [(m, amdahl(4.0, 0.8, m)) for m in (1, 2, 4)]),
    ],
)
def test_options_of_a_call_of_model_a_without_t1(served: str, allowed: list[int],
                                                 elastic: bool,
                                                 expected: list[tuple[int, float | None]],
                                                 ) -> None:
    """Its own fit once it ran at two DoPs; at one DoP, its level on the prior's shape (p 0.5);
    never served, the shape and level pooled over the models served (here b's); nothing
    served, the prior (elastic) or unknown (one count)."""
    model = DurationModel()
    for name, dop, seconds in SERVED[served]:
        learn(model, service_signature(name), dop, seconds, PRIOR)
    options = service_options(model, "a", "", allowed, elastic, PRIOR)
    assert [m for m, _ in options] == [m for m, _ in expected]
    for (_, got), (_, want) in zip(options, expected, strict=True):
        assert got == (None if want is None else pytest.approx(want, rel=0.03))


def test_models_are_learned_apart() -> None:
    model = DurationModel()
    for dop in (1, 4):
        learn(model, service_signature("slow"), dop, amdahl(20.0, 0.5, dop))
        learn(model, service_signature("fast"), dop, amdahl(2.0, 0.9, dop))
    slow = dict(service_options(model, "slow", "", [1, 4], True))
    fast = dict(service_options(model, "fast", "", [1, 4], True))
    assert slow[4] == pytest.approx(amdahl(20.0, 0.5, 4), rel=0.02)
    assert fast[4] == pytest.approx(amdahl(2.0, 0.9, 4), rel=0.02)
