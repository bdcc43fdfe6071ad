"""``tangram up --ha``: the compose file's ``ha`` profile as local processes (a primary, a replica
and three Sentinels), every service and the client on the Sentinels, and a failover the client
follows."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tangram_celery.connection import connect, durable
from tangram_celery.settings import Settings
from tangram_celery.stack.compose import read_env_file
from tangram_celery.stack.plan import HA_SERVICES, UpOptions, plan
from tangram_celery.stack.supervisor import LocalStack
from tangram_celery.stack.up import local_stack

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sentinels import MASTER, wait_until


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("TANGRAM_", "STACK_"))}


def running_argv(stack: LocalStack) -> list[str]:
    """The command lines (what ``ps`` shows) of the stack's processes."""
    found = []
    for running in stack.running.values():
        if running.process is not None:
            raw = Path(f"/proc/{running.process.pid}/cmdline").read_bytes()
            found.append(raw.replace(b"\0", b" ").decode(errors="replace"))
    return found


def test_ha_adds_the_replica_and_sentinels_and_points_every_service_at_them(
        tmp_path: Path) -> None:
    options = UpOptions(state_dir=tmp_path, env_file=tmp_path / "none.env", ha=True,
                        publish=False)
    _, services, _, _ = plan(options, clean_env())
    assert set(HA_SERVICES) <= set(services)
    sentinels = [services[f"sentinel-{i}"].ports[26379] for i in (1, 2, 3)]
    for name, service in services.items():
        url = service.environment["TANGRAM_REDIS_URL"]
        assert url.startswith("sentinel://"), (name, url)
        assert url.endswith(",".join(f"127.0.0.1:{p}" for p in sentinels) + "/0"), (name, url)
        assert service.environment["TANGRAM_REDIS_SENTINEL_PASSWORD"]
    primary = services["redis"].ports[6379]
    assert f"127.0.0.1:{primary}" in services["redis-replica"].argv
    plain = plan(UpOptions(state_dir=tmp_path, env_file=tmp_path / "none.env",
                           publish=False), clean_env())[1]
    assert "sentinel-1" not in plain
    assert plain["flower"].environment["TANGRAM_REDIS_URL"].startswith("redis://")


@pytest.mark.slow
def test_tangram_up_ha_serves_clients_across_a_failover(tmp_path: Path) -> None:
    options = UpOptions(state_dir=tmp_path / "state", env_file=tmp_path / "none.env",
                        services=("redis",), ha=True, publish=False)
    with local_stack(options, clean_env(), announce=lambda _: None) as stack:
        assert set(stack.order) == set(HA_SERVICES)
        client_env = read_env_file(tmp_path / "state" / "client.env")
        assert (tmp_path / "state" / "client.env").stat().st_mode & 0o077 == 0
        settings = Settings.from_env({k: v for k, v in client_env.items() if v})
        assert settings.broker.sentinel
        client = connect(settings.broker)
        wait_until(lambda: client.replicas() >= 1, 60, "the replica connected")
        durable(client, "test", lambda pipe: pipe.set("before", "1"))
        admin = connect(settings.broker).connection_pool.sentinel_manager.sentinels[0]
        assert admin.connection_pool.connection_kwargs["port"] in {
            stack.services[f"sentinel-{i}"].ports[26379] for i in (1, 2, 3)}
        first = client.connection_pool.get_master_address()
        wait_until(lambda: admin.sentinel_master(MASTER)["num-other-sentinels"] >= 2, 60,
                   "the Sentinels know each other")
        wait_until(lambda: admin.execute_command("SENTINEL", "FAILOVER", MASTER), 30,
                   "Sentinel accepts the failover")
        wait_until(lambda: client.connection_pool.get_master_address() != first, 60,
                   "a new primary")
        assert client.get("before") == b"1"
        client.set("after", "2")
        assert client.get("after") == b"2"
        secrets = read_env_file(tmp_path / "state" / "secrets.env")
        assert secrets["STACK_SENTINEL_PASSWORD"] == settings.broker.sentinel_password
        shown = [f"{name} in {entry}" for entry in running_argv(stack)
                 for name, value in secrets.items() if value in entry]
        shown += [f"{name} in {log.name}" for log in (tmp_path / "state" / "logs").glob("*.log")
                  for name, value in secrets.items() if value in log.read_text(errors="replace")]
        assert shown == [], "a password shows on a command line or in a log"
