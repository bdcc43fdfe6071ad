"""The admission gate: FCFS, exclusive units, release on every path, recorded allocations."""

from __future__ import annotations

import random
import threading
import time

import pytest

from tangram_celery.errors import TangramError
from tangram_celery.pools.admission import (
    Admission,
    PoolState,
    Request,
    fcfs_minimum,
)


def req(name: str, units: int, arrived: float = 0.0) -> Request:
    return Request(name, ((units, 1.0),), arrived)


FCFS = [
    ("all fit", [("a", 1), ("b", 2)], (0, 1, 2, 3), [("a", (0,)), ("b", (1, 2))]),
    ("head blocks the rest", [("a", 3), ("b", 1)], (0, 1), []),
    ("stops at first misfit", [("a", 1), ("b", 4), ("c", 1)], (0, 1, 2),
     [("a", (0,))]),
    ("nothing free", [("a", 1)], (), []),
]


@pytest.mark.parametrize(("name", "waiting", "free", "expected"), FCFS, ids=[c[0] for c in FCFS])
def test_fcfs_minimum(name: str, waiting: list[tuple[str, int]], free: tuple[int, ...],
                      expected: list[tuple[str, tuple[int, ...]]]) -> None:
    state = PoolState(tuple(req(n, u) for n, u in waiting), free, (), 4, 0.0)
    assert fcfs_minimum(state) == expected


def test_threads_get_exclusive_units_in_fcfs_order() -> None:
    gate = Admission(range(3))
    order: list[str] = []
    lock = threading.Lock()
    rng = random.Random(1)

    def work(name: str, units: int) -> None:
        got = gate.acquire(req(name, units, time.time()))
        with lock:
            order.append(name)
        assert len(got) == units
        time.sleep(rng.uniform(0, 0.01))
        gate.release(name)

    threads = []
    for i in range(40):
        thread = threading.Thread(target=work, args=(f"a{i:02d}", 1 + i % 3))
        threads.append(thread)
        thread.start()
        time.sleep(0.001)
    for thread in threads:
        thread.join(10)
    assert len(order) == 40 and gate.free_count() == 3
    intervals = [(r.start, r.end or 0.0, set(r.units)) for r in gate.records]
    for i, (s1, e1, u1) in enumerate(intervals):
        for s2, e2, u2 in intervals[i + 1:]:
            if s1 < e2 and s2 < e1:
                assert not u1 & u2, "a unit was held by two actions at once"


def test_release_is_idempotent_and_unknown_ids_are_ignored() -> None:
    gate = Admission([5, 6])
    units = gate.acquire(req("a", 2))
    assert units == (5, 6)
    gate.release("a")
    gate.release("a")
    gate.release("nobody")
    assert gate.free_count() == 2


def test_request_larger_than_pool_is_refused_at_once() -> None:
    gate = Admission(range(2))
    with pytest.raises(TangramError, match="needs at least 3 units"):
        gate.acquire(req("big", 3))


def test_timeout_leaves_no_waiter() -> None:
    gate = Admission(range(1))
    gate.acquire(req("a", 1))
    with pytest.raises(TimeoutError):
        gate.acquire(req("b", 1), timeout=0.05)
    assert gate.waiting_count() == 0


def test_policy_granting_busy_units_is_caught() -> None:
    def greedy(state: PoolState) -> list[tuple[str, tuple[int, ...]]]:
        return [(state.waiting[0].id, (0,))]

    gate = Admission(range(2), policy=greedy)
    gate.acquire(req("a", 1))
    with pytest.raises(TangramError, match="unavailable units"):
        gate.acquire(req("b", 1), timeout=1)


def test_the_gate_times_its_policy_and_says_which_call_admitted_each_action() -> None:
    def slow_fcfs(state: PoolState) -> list[tuple[str, tuple[int, ...]]]:
        time.sleep(0.02)
        return fcfs_minimum(state)

    gate = Admission(range(2), slow_fcfs)
    assert gate.acquire(req("a", 1)) == (0,)
    assert gate.decision_s("a") >= 0.02
    assert gate.decision_s("a") == 0.0, "asked once"
    assert gate.policy_calls == 1 and gate.policy_s >= 0.02
    gate.release("a")
    assert gate.policy_calls == 1, "no one waits: the policy is not asked"
    assert gate.decision_s("never-admitted") == 0.0


def test_postpone_moves_a_running_actions_expected_end_for_later_decisions() -> None:
    seen: list[PoolState] = []

    def record(state: PoolState) -> list[tuple[str, tuple[int, ...]]]:
        seen.append(state)
        return fcfs_minimum(state)

    gate = Admission(range(2), record, clock=lambda: 10.0)
    gate.acquire(Request("a", ((1, 2.0),), 0.0))
    gate.postpone("a", 3.0)
    gate.postpone("unknown", 3.0)
    gate.acquire(Request("b", ((1, 1.0),), 0.0))
    assert [r.expected_end for r in seen[-1].running] == [15.0], "10 + 2 s run + 3 s restore"


def test_a_running_action_grows_onto_free_units_and_gives_them_back() -> None:
    gate = Admission(range(3))
    assert gate.acquire(req("run", 1)) == (0,)
    assert gate.free_units() == (1, 2)
    first = gate.resize("run", (0, 2))
    assert first is not None and first.units == (0,) and first.end is not None
    assert gate.free_units() == (1,)
    assert gate.resize("run", (0, 2, 1)) is not None and gate.free_count() == 0
    assert gate.resize("run", (0,)) is not None and gate.free_units() == (1, 2)
    record = gate.release("run")
    assert record is not None and record.units == (0,)
    assert [r.units for r in gate.records] == [(0,), (0, 2), (0, 2, 1), (0,)]
    assert all(r.end is not None for r in gate.records)


def test_a_resize_onto_taken_units_changes_nothing() -> None:
    gate = Admission(range(2))
    gate.acquire(req("a", 1))
    gate.acquire(req("b", 1))
    assert gate.resize("a", (0, 1)) is None
    assert gate.resize("nobody", (0,)) is None
    assert gate.resize("a", ()) is None
    assert len(gate.records) == 2 and gate.free_count() == 0


def test_a_shrink_admits_a_waiting_action_at_once_on_the_core_given_back() -> None:
    waited: list[str] = []
    gate = Admission(range(2), on_wait=lambda: waited.append("poked"))
    gate.acquire(req("run", 2))
    got: list[tuple[int, ...]] = []
    thread = threading.Thread(target=lambda: got.append(gate.acquire(req("exec", 1))))
    thread.start()
    deadline = time.monotonic() + 30
    while not gate.waiting_requests():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert [r.id for r in gate.waiting_requests()] == ["exec"]
    assert gate.resize("run", (0,)) is not None
    thread.join(30)
    assert got == [(1,)] and waited == ["poked"] and gate.waiting_count() == 0
