"""The basic manager on a real Redis: its order across workers (FCFS, oldest trajectory first
with a bypass bound), caps never exceeded, leases reclaimed."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence

import pytest
import redis

from tangram_celery import keys
from tangram_celery.errors import ServiceError
from tangram_celery.managers.basic import ApiGate, Decision, Need, QuotaStore, parse_api_limits
from tangram_celery.managers.basic.policy import LEASES
from tangram_celery.managers.basic.store import Grant

SPECS = parse_api_limits(
    "one=url:http://one.test,concurrency:1,lease:0.3s;"
    "two=url:http://two.test,concurrency:2,lease:0.3s;"
    "fast=url:http://fast.test,rate:20/1s,burst:5;"
    "pair=url:http://pair.test,concurrency:1,lease:0.3s"
)


@pytest.fixture()
def gates(redis_url: str, redis_client: redis.Redis) -> Iterator[list[ApiGate]]:
    """Two gates with their own Redis connections: two workers, possibly on two hosts."""
    made = [ApiGate(QuotaStore(redis.Redis.from_url(redis_url), SPECS)) for _ in range(2)]
    yield made
    for gate in made:
        gate.stop()


def queued(done: list[str], gates: set[ApiGate]) -> int:
    """Threads that got into a gate so far. A thread moves waiting -> held -> done, so reading
    the states in the reverse order never counts one twice."""
    finished = len(done)
    held = sum(g.held_count() for g in gates)
    return finished + held + sum(g.waiting_count() for g in gates)


def arrive_in_order(gate_for: list[ApiGate], needs: tuple[Need, ...], hold_s: float,
                    log: list[str], timeout: float = 20.0) -> None:
    """Thread ``k`` arrives at ``gate_for[k]`` once threads ``0..k-1`` are all queued; each
    holds its grant ``hold_s`` and logs its name when granted."""
    done: list[str] = []
    threads = []
    for k, gate in enumerate(gate_for):
        def work(name: str = f"a{k}", gate: ApiGate = gate) -> None:
            grant = gate.acquire(name, needs, timeout=timeout)
            log.append(name)
            time.sleep(hold_s)
            gate.release(grant)
            done.append(name)

        thread = threading.Thread(target=work)
        thread.start()
        threads.append(thread)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and queued(done, set(gate_for)) < k + 1:
            time.sleep(0.001)
    for thread in threads:
        thread.join(timeout)


def test_one_gate_is_fcfs(gates: list[ApiGate]) -> None:
    log: list[str] = []
    arrive_in_order([gates[0]] * 8, (Need("one", 1),), 0.01, log)
    assert log == [f"a{k}" for k in range(8)]


def test_order_is_global_across_workers(gates: list[ApiGate]) -> None:
    log: list[str] = []
    arrive_in_order([gates[k % 2] for k in range(10)], (Need("one", 1),), 0.01, log)
    assert log == [f"a{k}" for k in range(10)]


ORDER_CASES = [
    # (case, bypass_s, pause between the new trajectory's call and the old one's, grant order)
    ("an older trajectory's call overtakes across workers", 60.0, 0.05, ["old-2", "new-1"]),
    ("bypass 0 is FCFS by arrival", 0.0, 0.05, ["new-1", "old-2"]),
    ("past the bypass bound nobody overtakes", 0.2, 0.4, ["new-1", "old-2"]),
]


@pytest.mark.parametrize(("case", "bypass", "pause", "order"), ORDER_CASES,
                         ids=[c[0] for c in ORDER_CASES])
def test_oldest_trajectory_first_with_a_bypass_bound(case: str, bypass: float, pause: float,
                                                      order: list[str], redis_url: str) -> None:
    made = [ApiGate(QuotaStore(redis.Redis.from_url(redis_url), SPECS, bypass))
            for _ in range(2)]
    log: list[str] = []
    try:
        holder = made[0].acquire("old-1", (Need("one", 1),), timeout=5, trajectory="old")

        def call(gate: ApiGate, name: str, trajectory: str) -> threading.Thread:
            def work() -> None:
                grant = gate.acquire(name, (Need("one", 1),), timeout=20, trajectory=trajectory)
                log.append(name)
                gate.release(grant)
            thread = threading.Thread(target=work)
            thread.start()
            return thread

        threads = [call(made[1], "new-1", "new")]
        while made[1].waiting_count() < 1:
            time.sleep(0.001)
        time.sleep(pause)
        threads.append(call(made[0], "old-2", "old"))
        while made[0].waiting_count() < 1:
            time.sleep(0.001)
        made[0].release(holder)
        for thread in threads:
            thread.join(20)
    finally:
        for gate in made:
            gate.stop()
    assert log == order


def test_concurrency_cap_holds_across_workers(gates: list[ApiGate]) -> None:
    lock = threading.Lock()
    active, peak, done = [0], [0], [0]

    def work(gate: ApiGate, k: int) -> None:
        grant = gate.acquire(f"c{k}", (Need("two", 1),), timeout=20)
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.01)
        with lock:
            active[0] -= 1
            done[0] += 1
        gate.release(grant)

    threads = [threading.Thread(target=work, args=(gates[k % 2], k)) for k in range(24)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert done[0] == 24 and peak[0] == 2


def test_quota_is_never_exceeded(gates: list[ApiGate]) -> None:
    stamps: list[float] = []
    lock = threading.Lock()

    def work(gate: ApiGate, k: int) -> None:
        gate.release(gate.acquire(f"r{k}", (Need("fast", 1),), timeout=20))
        with lock:
            stamps.append(time.monotonic())

    start = time.monotonic()
    threads = [threading.Thread(target=work, args=(gates[k % 2], k)) for k in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    stamps.sort()
    quota = SPECS["fast"].quota
    assert quota is not None
    capacity, rate = quota.capacity, quota.rate_per_s
    assert len(stamps) == 16
    for i, stamp in enumerate(stamps):
        earliest = (i + 1 - capacity) / rate
        assert stamp - start >= earliest - 0.01, (i, stamp - start)
    assert stamps[-1] - start < (16 - capacity) / rate + 1.0, "tokens are used when they refill"


def test_lease_of_a_dead_worker_comes_back(redis_client: redis.Redis,
                                           gates: list[ApiGate]) -> None:
    dead = QuotaStore(redis_client, SPECS)
    dead.register("dead", (Need("one", 1),))
    assert dead.try_acquire("dead", (Need("one", 1),)).granted  # then never renewed
    start = time.monotonic()
    grant = gates[0].acquire("alive", (Need("one", 1),), timeout=5)
    assert 0.2 < time.monotonic() - start < 2.0
    gates[0].release(grant)


def test_a_dead_waiting_ticket_does_not_block_forever(redis_client: redis.Redis,
                                                     gates: list[ApiGate]) -> None:
    QuotaStore(redis_client, SPECS).register("dead-waiter", (Need("one", 1),))
    start = time.monotonic()
    gates[0].release(gates[0].acquire("alive", (Need("one", 1),), timeout=5))
    assert 0.2 < time.monotonic() - start < 2.0


def test_running_actions_keep_their_lease(redis_client: redis.Redis,
                                          gates: list[ApiGate]) -> None:
    grant = gates[0].acquire("long", (Need("one", 1),), timeout=5)
    other = QuotaStore(redis_client, SPECS)
    other.register("probe", (Need("one", 1),))
    for _ in range(8):  # 1.2 s: four times the lease TTL
        time.sleep(0.15)
        assert other.try_acquire("probe", (Need("one", 1),)).reason == LEASES
        other.renew([("probe", (Need("one", 1),))], [])
    gates[0].release(grant)
    assert other.try_acquire("probe", (Need("one", 1),)).granted


def test_several_apis_all_or_nothing(redis_client: redis.Redis, gates: list[ApiGate]) -> None:
    blocker = gates[1].acquire("blocker", (Need("pair", 1),), timeout=5)
    both = (Need("fast", 1), Need("pair", 1))
    got: list[float] = []

    def take_both() -> None:
        grant = gates[0].acquire("both", both, timeout=10)
        got.append(time.monotonic())
        gates[0].release(grant)

    thread = threading.Thread(target=take_both)
    thread.start()
    time.sleep(0.3)
    store = QuotaStore(redis_client, SPECS)
    assert not got and store.state("fast").tokens is None, "no token taken while pair is busy"
    released = time.monotonic()
    gates[1].release(blocker)
    thread.join(10)
    assert got and got[0] - released < 0.5
    assert store.state("fast").tokens is not None


def test_multi_api_action_is_not_starved_by_a_stream(gates: list[ApiGate]) -> None:
    stop = threading.Event()
    served = [0]

    def stream(k: int) -> None:
        while not stop.is_set():
            gates[0].release(gates[0].acquire(f"s{k}-{served[0]}", (Need("two", 1),),
                                              timeout=10))
            served[0] += 1

    streams = [threading.Thread(target=stream, args=(k,)) for k in range(4)]
    for thread in streams:
        thread.start()
    time.sleep(0.1)
    start = time.monotonic()
    grant = gates[1].acquire("needs-both", (Need("two", 2), Need("one", 1)), timeout=10)
    waited = time.monotonic() - start
    gates[1].release(grant)
    stop.set()
    for thread in streams:
        thread.join(10)
    assert waited < 2.0 and served[0] > 10


def test_timeout_withdraws_the_ticket(redis_client: redis.Redis, gates: list[ApiGate]) -> None:
    holder = gates[0].acquire("holder", (Need("one", 1),), timeout=5)
    with pytest.raises(TimeoutError):
        gates[1].acquire("impatient", (Need("one", 1),), timeout=0.2)
    assert QuotaStore(redis_client, SPECS).state("one").tickets == ()
    gates[0].release(holder)


def test_stop_answers_waiters(gates: list[ApiGate]) -> None:
    holder = gates[0].acquire("holder", (Need("one", 1),), timeout=5)
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            gates[1].acquire("waiter", (Need("one", 1),), timeout=10)
        except ServiceError as exc:
            errors.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    while gates[1].waiting_count() == 0:
        time.sleep(0.005)
    gates[1].stop()
    thread.join(5)
    assert errors and "shutting down" in str(errors[0])
    gates[0].release(holder)


def test_a_failing_store_fails_the_action_instead_of_hanging(redis_client: redis.Redis) -> None:
    class Broken(QuotaStore):
        def try_acquire(self, ticket: str, needs: Sequence[Need],
                        now: float | None = None) -> Decision:
            raise ValueError("bug")

    gate = ApiGate(Broken(redis_client, SPECS))
    try:
        with pytest.raises(ServiceError, match="gate failed"):
            gate.acquire("x", (Need("one", 1),), timeout=5)
        assert QuotaStore(redis_client, SPECS).state("one").tickets == ()
    finally:
        gate.stop()


def test_a_lost_ticket_queues_again(redis_client: redis.Redis, gates: list[ApiGate]) -> None:
    holder = gates[0].acquire("holder", (Need("one", 1),), timeout=5)
    granted: list[bool] = []

    def wait() -> None:
        gates[1].release(gates[1].acquire("waiter", (Need("one", 1),), timeout=10))
        granted.append(True)

    thread = threading.Thread(target=wait)
    thread.start()
    while gates[1].waiting_count() == 0:
        time.sleep(0.005)
    redis_client.delete(keys.api_tickets("one"), keys.api_ticket_deadlines("one"))
    time.sleep(0.05)
    assert len(QuotaStore(redis_client, SPECS).state("one").tickets) == 1, "registered again"
    gates[0].release(holder)
    thread.join(10)
    assert granted == [True]


def test_a_held_lease_a_failover_lost_is_written_again_and_a_waiting_ticket_is_not(
        redis_client: redis.Redis) -> None:
    store = QuotaStore(redis_client, SPECS)
    needs = (Need("one", 1),)
    store.register("held", needs)
    assert store.try_acquire("held", needs).granted
    store.register("waiting", needs)
    redis_client.delete(keys.api_leases("one"), keys.api_ticket_deadlines("one"))
    grant = Grant("held", needs, time.time())
    store.renew([("waiting", needs)], [grant])
    assert redis_client.zrange(keys.api_leases("one"), 0, -1) == [b"held#1"]
    assert redis_client.zcard(keys.api_ticket_deadlines("one")) == 0
    store.release(grant)
    store.cancel("waiting", needs)
