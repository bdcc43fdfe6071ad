"""The gateway's line for a full pool: first come, first served, and a deadline that holds."""

from __future__ import annotations

import threading
import time

import pytest

from tangram_celery.errors import NoCapacityError
from tangram_celery.gateway.line import CapacityLine


def test_room_goes_to_the_waiters_in_arrival_order() -> None:
    line = CapacityLine()
    room = threading.Semaphore(0)
    order: list[int] = []

    def submit(index: int) -> int:
        if not room.acquire(blocking=False):
            raise NoCapacityError("full")
        order.append(index)
        return index

    threads = []
    for index in range(6):
        thread = threading.Thread(target=line.attempt,
                                  args=(lambda i=index: submit(i), time.monotonic() + 30))
        thread.start()
        threads.append(thread)
        while len(line) < index + 1:
            time.sleep(0.001)
    for _ in range(6):
        room.release()
        time.sleep(0.05)
    for thread in threads:
        thread.join(10)
    assert order == list(range(6))
    assert len(line) == 0


def test_no_wait_when_there_is_room_and_the_deadline_holds() -> None:
    line = CapacityLine()
    assert line.attempt(lambda: "ran", time.monotonic() + 1) == "ran"

    def full() -> str:
        raise NoCapacityError("full")

    with pytest.raises(NoCapacityError):
        line.attempt(full, time.monotonic() + 0.3)
    assert len(line) == 0
