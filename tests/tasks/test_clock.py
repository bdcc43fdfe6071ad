"""The broker clock: the offset estimate and the stamp shift (plain data), and a real Redis."""

from __future__ import annotations

import pytest
import redis
from result_checks import STAMPS

from tangram_celery.action import ActionResult, Timings
from tangram_celery.tasks.clock import (
    UNMEASURED,
    WORKER_STAMPS,
    BrokerClock,
    Offset,
    broker_time,
    estimate_offset,
    shifted,
)

SKEW = 0.4
"""A worker whose clock is 400 ms ahead of the broker's and the client's."""


@pytest.mark.parametrize(("samples", "offset", "error"), [
    ([(10.0, 9.0, 10.002)], 1.001, 0.001),
    ([(10.0, 9.5, 10.2), (11.0, 10.6, 11.002)], 0.401, 0.001),
    ([(5.0, 5.3, 5.004), (6.0, 6.2, 6.1)], -0.298, 0.002),
])
def test_the_shortest_round_trip_gives_the_offset(
    samples: list[tuple[float, float, float]], offset: float, error: float
) -> None:
    found = estimate_offset(samples)
    assert found.offset_s == pytest.approx(offset)
    assert found.error_s == pytest.approx(error + 1e-6, abs=1e-9)


@pytest.mark.parametrize(("offset", "correction"), [
    (Offset(0.4, 0.001), 0.4), (Offset(-0.3, 0.002), -0.3), (Offset(0.0004, 0.001), 0.0),
    (Offset(-0.001, 0.001), 0.0), (UNMEASURED, 0.0),
])
def test_an_offset_within_its_error_is_no_correction(offset: Offset, correction: float) -> None:
    assert offset.correction_s == correction


def worker_result(skew: float) -> ActionResult:
    """An action published at 100.0 (client clock = broker clock), received 5 ms later, admitted
    after 20 ms, run for 300 ms, stored 10 ms later, fetched 5 ms later; the worker's stamps are
    read on a clock ``skew`` seconds ahead."""
    worker = {"received": 100.005, "admitted": 100.025, "exec_started": 100.026,
              "exec_finished": 100.326, "stored": 100.336}
    timings = Timings(submitted=99.999, published=100.0, completed=100.341, exec_s=0.3,
                      **{k: v + skew for k, v in worker.items()})
    return ActionResult("a", "t", "exec", "ok", timings=timings)


@pytest.mark.parametrize("skew", [SKEW, -SKEW])
def test_a_skewed_worker_clock_breaks_the_act_parts_and_the_shift_repairs_them(
    skew: float,
) -> None:
    truth = worker_result(0.0).act
    raw = worker_result(skew)
    assert not in_order(raw.timings), "a worker ahead stores after the client completes; " \
        "one behind receives before the client publishes"
    assert raw.act["queue"] != pytest.approx(truth["queue"], abs=0.02)
    assert raw.act["overhead"] != pytest.approx(truth["overhead"], abs=0.005)
    repaired = ActionResult.from_json(shifted(raw.to_json(), -skew, Offset(skew, 0.0001)))
    for part in ("queue", "exec", "overhead", "total"):
        assert repaired.act[part] == pytest.approx(truth[part], abs=1e-9)
    assert repaired.timings.clock_offset_s == skew and in_order(repaired.timings)


def in_order(timings: Timings) -> bool:
    stamps = [getattr(timings, s) for s in STAMPS]
    return stamps == sorted(stamps)


def test_shift_moves_only_the_worker_stamps_that_are_set() -> None:
    result = ActionResult("a", "t", "exec", "rejected",
                          timings=Timings(submitted=5.0, received=7.0, stored=8.0)).to_json()
    moved = shifted(result, 2.0, UNMEASURED)["timings"]
    assert (moved["submitted"], moved["received"], moved["stored"]) == (5.0, 9.0, 10.0)
    assert moved["admitted"] == 0.0 and moved["clock_error_s"] == -1.0
    assert set(WORKER_STAMPS) <= set(moved)
    assert shifted({"status": "x"}, 2.0, UNMEASURED) == {"status": "x"}


def test_the_broker_clock_cancels_an_injected_skew(redis_client: redis.Redis) -> None:
    clock = BrokerClock(redis_client, skew_s=SKEW)
    offset = clock.offset()
    assert 0 <= offset.error_s < 0.05
    assert offset.offset_s == pytest.approx(SKEW, abs=offset.error_s + 0.002)
    before = broker_time(redis_client)
    now = clock.now()
    after = broker_time(redis_client)
    bound = offset.error_s + 0.002
    assert before - bound <= now <= after + bound
    assert clock.shift_s() == pytest.approx(SKEW - offset.offset_s)
    assert BrokerClock(redis_client).shift_s() == 0.0, "one host's clock agrees with itself"


def test_an_unreachable_broker_leaves_stamps_uncorrected() -> None:
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    assert BrokerClock(dead, skew_s=0.1).offset() == UNMEASURED
