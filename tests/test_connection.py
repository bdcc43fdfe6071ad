"""tangram_celery.connection: URLs, which commands are retried, and a real Sentinel-managed
Redis (a primary, a replica and three Sentinels as processes) that the clients, the scripts and
Celery follow across a failover."""

from __future__ import annotations

import hashlib
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tangram_celery.connection import (
    DURABILITY,
    Policy,
    connect,
    durable,
    idempotent,
    is_safe,
    kombu_url,
    parse_url,
)
from tangram_celery.pools.registry import PIN_SCRIPT, Registry
from tangram_celery.settings import BrokerSettings, Settings
from tangram_celery.tasks.app import make_app

sys.path.insert(0, str(Path(__file__).parent))
from sentinels import MASTER, HaLayout, local_ha, wait_until


def test_both_sentinel_url_forms_read_alike() -> None:
    short = parse_url("sentinel://:p%40ss@s1:26379,s2,10.0.0.3:26380/2")
    long = parse_url("sentinel://:p%40ss@s1:26379/2;sentinel://s2/2;sentinel://10.0.0.3:26380/2")
    assert short == long
    assert short.hosts == (("s1", 26379), ("s2", 26379), ("10.0.0.3", 26380))
    assert (short.password, short.db) == ("p@ss", 2)


def test_celery_reads_the_kombu_form_with_the_password_once() -> None:
    url = kombu_url("sentinel://:pw@s1:1,s2:2/0")
    assert url == "sentinel://:pw@s1:1/0;sentinel://s2:2/0"
    assert kombu_url("redis://:pw@h:6379/0") == "redis://:pw@h:6379/0"
    config = make_app(Settings.from_env({}, redis_url="sentinel://:pw@s1:1,s2:2/0",
                                        redis_sentinel_password="sp")).conf
    assert config.broker_url == url
    assert config.broker_transport_options["master_name"] == "tangram"
    assert config.broker_transport_options["sentinel_kwargs"]["password"] == "sp"
    assert config.broker_transport_options["visibility_timeout"] > 0
    assert config.result_backend_transport_options["master_name"] == "tangram"


@pytest.mark.parametrize(("command", "safe"), [
    (("GET", "k"), True), (("SET", "k", "v", "NX"), True), (("HSET", "h", "f", "v"), True),
    (("ZADD", "z", "1", "m"), True), (("ZADD", "z", "INCR", "1", "m"), False),
    (("INCR", "k"), False), (("LPUSH", "l", "v"), False), (("XADD", "s", "*", "f", "v"), False),
    (("EVAL", "return 1", 0), False), (("EVALSHA", "0" * 40, 0), False),
])
def test_only_commands_that_do_no_harm_twice_are_retried(command: tuple[object, ...],
                                                           safe: bool) -> None:
    assert is_safe(command) == safe


def test_a_script_declared_idempotent_is_retried() -> None:
    text = idempotent("return 'tangram-test'")
    assert is_safe(("EVAL", text, 0))
    assert is_safe(("EVALSHA", hashlib.sha1(PIN_SCRIPT.encode()).hexdigest(), 4))


@pytest.fixture
def accepting() -> Iterator[tuple[int, list[int]]]:
    """A port that accepts connections and closes them at once, counting them."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.2)
    count = [0]
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            count[0] += 1
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], count
    stop.set()
    thread.join()
    server.close()


def test_a_counter_is_sent_once_and_a_read_is_retried(accepting: tuple[int, list[int]]) -> None:
    port, count = accepting
    client = connect(BrokerSettings(retry_s=1.0, timeout_s=0.5),
                     f"redis://127.0.0.1:{port}/0")
    with pytest.raises(redis.ConnectionError):
        client.incr("k")
    once = count[0]
    with pytest.raises(redis.ConnectionError):
        client.get("k")
    assert once == 1 and count[0] - once > 2, (once, count[0])


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HaLayout]:
    with local_ha(tmp_path_factory.mktemp("ha")) as layout:
        yield layout


def failover(ha: HaLayout) -> tuple[str, int]:
    """Promote the replica (Sentinel's coordinated failover); returns the new primary."""
    before = ha.master_seen_by(0)
    wait_until(lambda: all(ha.ready(i) for i in range(3)), 60, "every Sentinel can promote")
    wait_until(lambda: ha.sentinel(0).execute_command("SENTINEL", "FAILOVER", MASTER), 30,
               "Sentinel accepts the failover")
    wait_until(lambda: all(ha.master_seen_by(i) not in (None, before) for i in range(3)), 60,
               "every Sentinel names the new primary")
    after = ha.master_seen_by(0)
    assert after is not None
    wait_until(lambda: ha.data(after).info("replication").get("connected_slaves", 0) >= 1
               and all(ha.ready(i) for i in range(3)), 60, "the old primary follows it")
    return after


@pytest.mark.slow
def test_clients_scripts_and_celery_follow_a_failover(ha: HaLayout) -> None:
    settings = Settings.from_env(ha.env)
    client = connect(settings.broker)
    assert isinstance(client.policy, Policy) and client.policy.wait_replicas == 1
    registry = Registry(client, 10.0, 3600)
    registry.register_node("n1", 2, 1024)
    covered = DURABILITY.snapshot().get("pin", {}).get("covered", 0)
    assert registry.pin("t-1", "n1", 100) == "n1"
    assert DURABILITY.snapshot()["pin"]["covered"] == covered + 1
    first = ha.master_seen_by(0)
    app = make_app(settings)
    app.send_task("tangram.action.exec", args=[{}], queue="ha-q", task_id="before")
    second = failover(ha)
    assert second != first
    assert registry.pinned_node("t-1") == "n1", "a durable pin outlived the failover"
    assert registry.pin("t-2", "n1", 100) == "n1", "the pin script runs on the new primary"
    assert client.connection_pool.get_master_address() == second
    assert ha.data(second).llen("ha-q") == 1, "the message published before is on it"
    app.send_task("tangram.action.exec", args=[{}], queue="ha-q", task_id="after")
    app.backend.store_result("after", {"ok": True}, "SUCCESS")
    assert ha.data(second).llen("ha-q") == 2
    assert app.backend.get_task_meta("after")["result"] == {"ok": True}
    first_back = failover(ha)
    assert first_back == first
    assert registry.pinned_node("t-2") == "n1"


@pytest.mark.slow
def test_a_write_no_replica_confirms_is_done_and_counted(ha: HaLayout) -> None:
    settings = Settings.from_env(ha.env, redis_wait_ms=200)
    client = connect(settings.broker)
    replica = ha.data(ha.replica if ha.master_seen_by(0) == ha.primary else ha.primary)
    replica.execute_command("CLIENT", "PAUSE", "1500", "ALL")
    before = DURABILITY.snapshot().get("test", {}).get("uncovered", 0)
    durable(client, "test", lambda pipe: pipe.set("uncovered", "1"))
    assert client.get("uncovered") == b"1"
    assert DURABILITY.snapshot()["test"]["uncovered"] == before + 1
