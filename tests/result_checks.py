"""Checks that every result of a real run must pass, shared by the CPU and GPU path tests."""

from __future__ import annotations

import itertools

import pytest

from tangram_celery.action import ActionResult

STAMPS = ("submitted", "published", "received", "admitted", "exec_started", "exec_finished",
          "stored", "completed")


def check_act(result: ActionResult, slack: float = 0.0) -> None:
    """The parts add up and the stamps are in causal order; ``slack``: how far stamps of two
    hosts' clocks may be out of order (their offset estimates' error, see tasks/clock.py)."""
    act = result.act
    assert act["queue"] >= 0 and act["exec"] > 0 and act["overhead"] >= 0
    assert act["queue"] + act["exec"] + act["overhead"] == pytest.approx(act["total"], abs=1e-6)
    stamps = [getattr(result.timings, s) for s in STAMPS]
    assert all(later >= earlier - slack for earlier, later in itertools.pairwise(stamps)), \
        dict(zip(STAMPS, stamps, strict=True))
    window = result.timings.exec_finished - result.timings.exec_started
    assert result.timings.exec_s <= window + 1e-3


def check_exclusive(results: list[ActionResult]) -> None:
    for a, b in itertools.combinations(results, 2):
        if a.node != b.node:
            continue
        overlap = (a.timings.exec_started < b.timings.exec_finished
                   and b.timings.exec_started < a.timings.exec_finished)
        if overlap:
            assert not set(a.units) & set(b.units), (a.action_id, b.action_id, a.units)
