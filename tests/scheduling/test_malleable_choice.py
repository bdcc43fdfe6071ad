"""Which pytest runs a resizing node makes malleable, and the policy it resizes them with:
plain data."""

from __future__ import annotations

import pytest

from tangram_celery.scheduling.malleable import (
    WORTH_STARTS,
    node_config,
    worth_malleable,
)

CHOICES = [
    # asked, elastic, learned single-core s, worker start s, malleable
    (None, True, None, 1.0, True),
    (None, True, WORTH_STARTS * 1.0, 1.0, True),
    (None, True, WORTH_STARTS * 1.0 - 0.01, 1.0, False),
    (None, False, 100.0, 1.0, False),
    (True, False, 0.1, 1.0, True),
    (False, True, 100.0, 1.0, False),
    (None, True, 0.5, 0.0, True),
]


@pytest.mark.parametrize(("asked", "elastic", "single", "start", "expected"), CHOICES)
def test_a_run_is_malleable_when_asked_or_when_a_second_worker_can_pay_its_start(
        asked: bool | None, elastic: bool, single: float | None, start: float,
        expected: bool) -> None:
    assert worth_malleable(asked, elastic, single, start) is expected


def test_the_node_resizes_with_the_policy_the_simulator_measures() -> None:
    config = node_config(0.75, "equi")
    assert (config.worker_start_s, config.weighting, config.others_first, config.move_gain) == (
        0.75, "equi", True, 0.0)
    assert node_config(0.75, "shortest").weighting == "shortest"
    with pytest.raises(ValueError, match="unknown weighting 'fastest'"):
        node_config(0.75, "fastest")
