"""The online duration model: T1 and E(m) per signature, robust updates, JSON-safe state."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tangram_celery.scheduling import DurationModel, EstimatorConfig, Job, Snapshot, decide
from tangram_celery.scheduling.types import Core, CpuPool

SIG = ("test-run", "repo-a")


def amdahl(t1: float, serial: float, units: int) -> float:
    return t1 * (serial + (1 - serial) / units)


def test_an_unseen_signature_is_unknown() -> None:
    model = DurationModel()
    assert not model.known(SIG)
    assert model.estimate(SIG, 1) is None
    assert model.t1(SIG) is None
    assert model.options(SIG, [1, 2, 4]) == ((1, None), (2, None), (4, None))


def test_one_unit_count_seen_gives_no_elasticity() -> None:
    model = DurationModel()
    model.observe(SIG, 1, 6.0)
    (one, six), (two, unknown) = model.options(SIG, [2, 1])
    assert (one, two, unknown) == (1, 2, None)
    assert six == pytest.approx(6.0)
    assert model.efficiency(SIG, 2) is None
    job = Job("j", "cpu", model.options(SIG, [1, 2]), 0.0)
    assert not job.is_elastic


def test_learns_t1_and_efficiency_from_several_unit_counts() -> None:
    model = DurationModel()
    for _ in range(3):
        for units in (1, 2, 4):
            model.observe(SIG, units, amdahl(10.0, 0.2, units))
    assert model.t1(SIG) == pytest.approx(10.0)
    assert model.estimate(SIG, 8) == pytest.approx(amdahl(10.0, 0.2, 8))  # never seen
    assert model.efficiency(SIG, 4) == pytest.approx(10.0 / (4 * amdahl(10.0, 0.2, 4)))


def test_t1_is_inferred_when_one_unit_was_never_used() -> None:
    model = DurationModel()
    for units in (2, 4, 8):
        model.observe(SIG, units, amdahl(12.0, 0.1, units))
    assert model.t1(SIG) == pytest.approx(12.0)


def test_an_outlier_barely_moves_the_estimate_but_a_real_shift_is_followed() -> None:
    model = DurationModel()
    for i in range(30):
        model.observe(SIG, 1, 10.0 * (1.02 if i % 2 else 0.98))
    model.observe(SIG, 1, 1000.0)  # a stuck run
    assert model.estimate(SIG, 1) == pytest.approx(10.0, rel=0.05)
    model.observe(SIG, 1, 0.001)  # an instant failure
    assert model.estimate(SIG, 1) == pytest.approx(10.0, rel=0.05)
    for _ in range(60):
        model.observe(SIG, 1, 20.0)  # the task really got slower
    assert model.estimate(SIG, 1) == pytest.approx(20.0, rel=0.05)


def test_offline_profiles_are_seeded_then_refined() -> None:
    model = DurationModel()
    model.seed_profile(SIG, 8.0, {2: 0.9, 4: 0.8})
    assert model.estimate(SIG, 4) == pytest.approx(8.0 / (0.8 * 4))
    model.observe(SIG, 1, 16.0)
    first = model.estimate(SIG, 1)
    assert first is not None and 8.0 < first < 10.0  # a profile counts as several observations
    for _ in range(40):
        model.observe(SIG, 1, 16.0)
    assert model.estimate(SIG, 1) == pytest.approx(16.0, rel=0.02)


def test_invalid_observations_are_ignored() -> None:
    model = DurationModel()
    for units, duration in ((0, 1.0), (1, 0.0), (1, -1.0), (1, math.nan), (1, math.inf)):
        model.observe(SIG, units, duration)
    assert not model.known(SIG)
    with pytest.raises(ValueError):
        model.seed(SIG, 1, 0.0)


def test_state_round_trips_through_json() -> None:
    model = DurationModel(EstimatorConfig(alpha=0.3))
    for units in (1, 2, 4):
        model.observe(SIG, units, amdahl(5.0, 0.3, units))
        model.observe(("reward", "rm-7b"), units, 2.0 / units)
    data = json.loads(json.dumps(model.to_dict()))
    again = DurationModel.from_dict(data, EstimatorConfig(alpha=0.3))
    assert again.to_dict() == model.to_dict()
    assert again.options(SIG, [1, 3, 8]) == model.options(SIG, [1, 3, 8])
    with pytest.raises(ValueError, match="format"):
        DurationModel.from_dict({"version": 99, "signatures": []})


positive = st.floats(1e-3, 1e4, allow_nan=False)


@settings(deadline=None)
@given(st.lists(positive, min_size=1, max_size=40))
def test_the_estimate_stays_within_what_was_observed(durations: list[float]) -> None:
    model = DurationModel()
    for duration in durations:
        model.observe(SIG, 2, duration)
    estimate = model.estimate(SIG, 2)
    assert estimate is not None
    assert min(durations) * (1 - 1e-9) <= estimate <= max(durations) * (1 + 1e-9)


@settings(deadline=None)
@given(st.dictionaries(st.integers(1, 16), positive, min_size=2, max_size=5), st.integers(1, 32))
def test_efficiency_is_within_zero_and_one(points: dict[int, float], units: int) -> None:
    model = DurationModel()
    for count, duration in points.items():
        model.observe(SIG, count, duration)
    efficiency = model.efficiency(SIG, units)
    assert efficiency is not None and 0 < efficiency <= 1


def test_learned_options_drive_an_elastic_decision() -> None:
    model = DurationModel()
    for units in (1, 2, 4):
        model.observe(SIG, units, amdahl(8.0, 0.0, units))
    job = Job("j", "cpu", model.options(SIG, range(1, 5)), 0.0)
    pool = CpuPool("cpu", tuple(Core(i) for i in range(4)), 4)
    decision = decide(Snapshot(0.0, (job,), (pool,)))
    assert decision.starts[0].count == 4
