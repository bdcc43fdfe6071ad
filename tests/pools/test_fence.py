"""The fence of a worker cut off from Redis (plain data: a fake clock, callbacks that record).
The cut link itself is in tests/system/test_fencing.py."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tangram_celery.errors import AlreadyAnswered
from tangram_celery.pools.fence import CLOSED, Fence


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fence(answers: dict[str, dict[str, Any]] | None = None,
          closed: list[int] | None = None) -> tuple[Fence, Clock]:
    clock = Clock()
    seen = closed if closed is not None else []
    made = Fence("node-x", 3.0, (answers or {}).get, lambda: seen.append(1), clock)
    return made, clock


def test_it_closes_only_past_the_ttl_and_calls_back_once() -> None:
    calls: list[int] = []
    made, clock = fence(closed=calls)
    clock.now += 3.0
    assert not made.check()
    clock.now += 0.01
    assert made.check() and made.check()
    assert calls == [1] and made.closings == 1


def test_a_beat_that_reaches_redis_renews_and_one_after_a_closing_registers() -> None:
    made, clock = fence()
    done: list[str] = []
    clock.now += 2.5
    made.beat(lambda: done.append("renew"), lambda: done.append("register"))
    clock.now += 2.5
    assert not made.closed
    clock.now += 1.0
    assert made.closed
    made.beat(lambda: done.append("renew"), lambda: done.append("register"))
    assert done == ["renew", "register"] and not made.closed


def test_a_failed_beat_leaves_it_closed() -> None:
    made, clock = fence()
    clock.now += 4.0

    def unreachable() -> None:
        raise ConnectionError("cut")

    with pytest.raises(ConnectionError):
        made.beat(unreachable, unreachable)
    assert made.closed


def test_an_action_waits_at_a_closed_fence_until_the_worker_registers() -> None:
    made, clock = fence()
    mark = made.mark()
    clock.now += 4.0
    assert made.closed
    entered = threading.Event()
    worker = threading.Thread(target=lambda: (made.enter("a-1", mark), entered.set()))
    worker.start()
    assert not entered.wait(0.6), "an action started while fenced"
    made.beat(lambda: None, lambda: None)
    assert entered.wait(5)
    worker.join()


def test_an_action_answered_while_fenced_is_not_run() -> None:
    answers = {"a-1": {"status": "node_lost"}}
    made, clock = fence(answers)
    mark = made.mark()
    clock.now += 4.0
    made.check()
    made.beat(lambda: None, lambda: None)
    with pytest.raises(AlreadyAnswered) as caught:
        made.enter("a-1", mark)
    assert caught.value.result == {"status": "node_lost"}
    made.enter("a-2", mark)


def test_without_a_closing_nothing_is_looked_up() -> None:
    made, _ = fence({"a-1": {"status": "ok"}})
    made.enter("a-1", made.mark())
    received_closed = CLOSED
    with pytest.raises(AlreadyAnswered):
        made.enter("a-1", received_closed)
