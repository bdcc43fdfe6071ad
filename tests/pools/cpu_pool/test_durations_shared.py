"""Durations learned cluster-wide through one Redis stream (real Redis, real node workers)."""

from __future__ import annotations

import time

import pytest
import redis
from test_elastic_node import CpuWorkers

from tangram_bench.emulation import emulated_test_run
from tangram_celery import keys
from tangram_celery.client import TangramClient
from tangram_celery.pools.duration_sharing import SharedDurations, parse_entry
from tangram_celery.pools.serving import Heartbeat
from tangram_celery.processes import free_ports
from tangram_celery.scheduling import DurationModel
from tangram_celery.settings import Settings

SIG = ("test_run", "repo-1")


def node(client: redis.Redis, name: str, every_s: float = 1.0) -> SharedDurations:
    return SharedDurations(client, name, DurationModel(), every_s)


def test_what_one_node_learns_the_others_read(redis_client: redis.Redis) -> None:
    a, b = node(redis_client, "a"), node(redis_client, "b")
    a.learn(SIG, 1, 8.0)
    a.learn(SIG, 4, 2.0)
    assert a.model.observed(SIG) == (1, 4) and b.model.observed(SIG) == ()
    assert b.catch_up() == 2
    assert b.model.estimate(SIG, 2) == pytest.approx(a.model.estimate(SIG, 2))
    assert a.catch_up() == 0, "a node does not learn its own entries twice"
    assert b.catch_up() == 0, "each entry is read once"


def test_a_node_that_starts_later_reads_the_history(redis_client: redis.Redis) -> None:
    a = node(redis_client, "a")
    for units in (1, 2, 4):
        a.learn(SIG, units, 8.0 / units)
    late = node(redis_client, "late")
    assert late.catch_up() == 3
    assert late.model.observed(SIG) == (1, 2, 4)


def test_a_sync_thread_reads_the_others_every_interval(redis_client: redis.Redis) -> None:
    b = node(redis_client, "b", every_s=0.05)

    def beat() -> None:
        b.catch_up()

    sync = Heartbeat("durations-b", b.every_s, beat)
    sync.start()
    try:
        node(redis_client, "a").learn(SIG, 1, 3.0)
        deadline = time.monotonic() + 10
        while b.model.observed(SIG) != (1,) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        sync.stop()
    assert b.model.observed(SIG) == (1,)


def test_a_malformed_entry_is_skipped_and_the_rest_learned(redis_client: redis.Redis) -> None:
    key = keys.duration_log()
    good = {"node": "a", "kind": "test_run", "key": "repo-1", "units": "2", "seconds": "4.0"}
    for bad in ({"node": "a"}, {**good, "units": "0"}, {**good, "seconds": "nan"},
                {**good, "seconds": "-1"}, {**good, "units": "x"}, {**good, "kind": ""}):
        redis_client.xadd(key, bad)  # type: ignore[arg-type]
    redis_client.xadd(key, good)  # type: ignore[arg-type]
    b = node(redis_client, "b")
    assert b.catch_up() == 1
    assert b.model.observed(SIG) == (2,)
    assert parse_entry({b"node": b"a", b"kind": b"k", b"key": b"", b"units": b"1",
                        b"seconds": b"0.5"}) == ("a", ("k", ""), 1, 0.5)


def test_the_stream_is_trimmed_to_what_it_keeps(redis_client: redis.Redis) -> None:
    a = SharedDurations(redis_client, "a", DurationModel(), 0.0, keep=10)
    for i in range(500):
        a.learn(SIG, 1 + i % 4, 1.0 + i % 3)
    assert redis_client.xlen(keys.duration_log()) < 500


def test_without_redis_a_node_still_learns_alone() -> None:
    (port,) = free_ports(1)
    client = redis.Redis(port=port, socket_connect_timeout=0.2, socket_timeout=0.2)
    alone = node(client, "a")
    alone.learn(SIG, 1, 8.0)
    assert alone.model.observed(SIG) == (1,)
    assert alone.catch_up() == 0


@pytest.mark.slow
def test_node_workers_publish_what_they_finish(
    settings: Settings, cpu_workers: CpuWorkers, redis_client: redis.Redis
) -> None:
    cpu_workers({"sd-a": 2, "sd-b": 2})
    with TangramClient(settings) as client:
        results = client.run_batch([emulated_test_run(f"s{i}", 0.2, 0.9, 2, signature="repo-9")
                                    for i in range(4)], timeout=60)
        for i in range(4):
            client.end_trajectory(f"s{i}")
    assert all(r.ok for r in results)
    entries = [parse_entry(fields) for _, fields in
               redis_client.xrange(keys.duration_log())]  # type: ignore[union-attr]
    assert {e[1] for e in entries if e} == {("test_run", "repo-9")}
    assert {e[0] for e in entries if e} == {r.node for r in results}
    assert len(entries) == 4
