"""learned_options: a signature's own fit, else its kind's pooled shape, else the prior; the
level from the signature, else the kind's pooled level (plain data)."""

from __future__ import annotations

import pytest

from tangram_celery.scheduling import DurationModel
from tangram_celery.scheduling.learned import (
    ANY,
    Prior,
    kind_signature,
    learn,
    learned_options,
    level_signature,
    shape_signature,
)

SIG = ("test_run", "p1")


def amdahl(t1: float, p: float, m: int) -> float:
    return t1 * ((1 - p) + p / m)


def test_nothing_known_an_elastic_action_gets_the_prior_over_every_count() -> None:
    options = learned_options(DurationModel(), SIG, [1, 2, 4], Prior(10.0, 0.5))
    assert options == ((1, 10.0), (2, 7.5), (4, 6.25))


def test_nothing_known_an_inelastic_action_stays_unknown() -> None:
    assert learned_options(DurationModel(), ("exec", ""), [1]) == ((1, None),)


def test_learn_feeds_the_signature_and_its_kind() -> None:
    model = DurationModel()
    learn(model, SIG, 2, 3.0)
    assert model.observed(SIG) == (2,) and model.observed(kind_signature(SIG)) == (2,)
    assert kind_signature(SIG) == ("test_run", ANY)


def test_a_signature_seen_once_takes_the_kind_curve_at_its_own_level() -> None:
    model = DurationModel()
    for m in (1, 4):
        learn(model, ("test_run", "other"), m, amdahl(20.0, 0.9, m))
    model.observe(SIG, 1, 40.0)
    options = dict(learned_options(model, SIG, [1, 2, 4]))
    assert options[1] == pytest.approx(40.0)
    assert options[4] == pytest.approx(amdahl(40.0, 0.9, 4), rel=0.05)


def test_a_signature_seen_at_two_counts_uses_its_own_fit() -> None:
    model = DurationModel()
    for m in (1, 8):
        learn(model, ("test_run", "other"), m, amdahl(20.0, 0.2, m))
        learn(model, SIG, m, amdahl(10.0, 0.9, m))
    options = dict(learned_options(model, SIG, [1, 2, 8]))
    assert options[2] == pytest.approx(amdahl(10.0, 0.9, 2), rel=0.02)
    assert options[8] == pytest.approx(amdahl(10.0, 0.9, 8), rel=0.02)


def test_a_new_signature_of_a_known_kind_gets_the_kind_level_and_curve() -> None:
    model = DurationModel()
    for m in (1, 2):
        learn(model, ("test_run", "other"), m, amdahl(6.0, 1.0, m))
    options = dict(learned_options(model, SIG, [1, 2]))
    assert options[1] == pytest.approx(6.0) and options[2] == pytest.approx(3.0)


def test_a_kind_seen_at_one_count_keeps_the_prior_curve_at_its_level() -> None:
    model = DurationModel()
    learn(model, ("test_run", "other"), 1, 30.0)
    options = dict(learned_options(model, SIG, [1, 2], Prior(10.0, 0.5)))
    assert options == {1: pytest.approx(30.0), 2: pytest.approx(22.5)}


def test_the_kind_shape_is_not_confounded_by_which_suite_ran_at_which_count() -> None:
    model = DurationModel()
    for m in (1, 2):
        learn(model, ("test_run", "long"), m, amdahl(100.0, 0.9, m))
    learn(model, ("test_run", "short"), 8, amdahl(10.0, 0.9, 8))
    raw = model.estimate(kind_signature(SIG), 8), model.estimate(kind_signature(SIG), 1)
    assert raw[0] is not None and raw[1] is not None
    assert raw[0] / raw[1] < 0.5 * amdahl(1.0, 0.9, 8)  # one raw curve: ten times too steep
    options = dict(learned_options(model, SIG, [1, 4, 8]))
    assert options[4] / options[1] == pytest.approx(amdahl(1.0, 0.9, 4), rel=0.02)
    assert options[8] / options[1] == pytest.approx(amdahl(1.0, 0.9, 8), rel=0.02)
    assert 10.0 < options[1] < 100.0  # between the suites' single-unit times


def test_the_pooled_entries_are_not_fed_again() -> None:
    model = DurationModel()
    learn(model, shape_signature(SIG), 2, 0.6)
    learn(model, level_signature(SIG), 1, 9.0)
    assert model.observed(kind_signature(SIG)) == ()


def test_a_bad_prior_is_refused() -> None:
    with pytest.raises(ValueError, match="prior"):
        Prior(0.0, 0.5)
