"""A Sentinel-managed Redis on real processes, for tests: a primary (``tangram redis``), its
replica (``tangram redis --replica-of``) and three Sentinels (``tangram sentinel``), on loopback
(:func:`local_ha`) or on test hosts (:class:`HaLayout` gives each one's command and address)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from tangram_celery.processes import free_ports, spawn_process, stop_process

MASTER = "tangram"


@dataclass(frozen=True)
class HaLayout:
    """Where each part of a Sentinel-managed Redis listens, and its passwords."""

    primary: tuple[str, int]
    replica: tuple[str, int]
    sentinels: tuple[tuple[str, int], ...]
    password: str = field(default_factory=lambda: f"ha-{uuid.uuid4().hex}")
    sentinel_password: str = field(default_factory=lambda: f"hs-{uuid.uuid4().hex}")
    down_after_ms: int = 2000

    @property
    def url(self) -> str:
        """``TANGRAM_REDIS_URL`` naming the Sentinels."""
        hosts = ",".join(f"{h}:{p}" for h, p in self.sentinels)
        return f"sentinel://:{self.password}@{hosts}/0"

    @property
    def env(self) -> dict[str, str]:
        """The settings every process of the stack reads."""
        return {"TANGRAM_REDIS_URL": self.url, "TANGRAM_REDIS_MASTER_NAME": MASTER,
                "TANGRAM_REDIS_SENTINEL_PASSWORD": self.sentinel_password}

    def primary_argv(self, data_dir: Path) -> list[str]:
        host, port = self.primary
        return [sys.executable, "-m", "tangram_celery.cli", "redis", "--bind", host,
                "--port", str(port), "--dir", str(data_dir)]

    def replica_argv(self, data_dir: Path) -> list[str]:
        host, port = self.replica
        return [sys.executable, "-m", "tangram_celery.cli", "redis", "--bind", host,
                "--port", str(port), "--dir", str(data_dir),
                "--replica-of", f"{self.primary[0]}:{self.primary[1]}"]

    def sentinel_argv(self, index: int, data_dir: Path) -> list[str]:
        host, port = self.sentinels[index]
        return [sys.executable, "-m", "tangram_celery.cli", "sentinel", "--bind", host,
                "--port", str(port), "--dir", str(data_dir), "--down-after-ms",
                str(self.down_after_ms), "--monitor", f"{self.primary[0]}:{self.primary[1]}"]

    def data(self, address: tuple[str, int], timeout: float = 1.0) -> redis.Redis:
        """A plain client of one data node."""
        return redis.Redis(host=address[0], port=address[1], password=self.password,
                           socket_timeout=timeout, socket_connect_timeout=timeout)

    def sentinel(self, index: int, timeout: float = 1.0) -> redis.Redis:
        """A plain client of one Sentinel."""
        host, port = self.sentinels[index]
        return redis.Redis(host=host, port=port, password=self.sentinel_password,
                           socket_timeout=timeout, socket_connect_timeout=timeout)

    def master_seen_by(self, index: int) -> tuple[str, int] | None:
        """The primary Sentinel ``index`` names now."""
        try:
            reply = self.sentinel(index).execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME",
                                                         MASTER)
        except (redis.RedisError, OSError):
            return None
        return (reply[0].decode(), int(reply[1])) if reply else None

    def ready(self, index: int) -> bool:
        """Whether Sentinel ``index`` knows the replica and both other Sentinels (a failover
        can then be agreed)."""
        try:
            info = self.sentinel(index).execute_command("SENTINEL", "MASTER", MASTER)
        except (redis.RedisError, OSError):
            return False
        fields = _text(info)
        return (int(fields.get("num-other-sentinels", 0)) >= len(self.sentinels) - 1
                and self._promotable_replica(index))

    def _promotable_replica(self, index: int) -> bool:
        """Whether Sentinel ``index`` sees a replica it would promote: linked to its primary,
        flagged only ``slave`` (without this a forced failover can answer NOGOODSLAVE)."""
        replicas = self.sentinel(index).execute_command("SENTINEL", "REPLICAS", MASTER)
        return any(_text(r).get("flags") == "slave"
                   and _text(r).get("master-link-status") == "ok" for r in replicas)


def _text(reply: Any) -> dict[str, str]:
    """A Sentinel reply (a dict, or a flat list of names and values) with ``str`` keys and
    values."""
    pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2],
                                                               strict=True)
    return {(k.decode() if isinstance(k, bytes) else str(k)):
            (v.decode() if isinstance(v, bytes) else str(v)) for k, v in pairs}


def wait_until(condition: Callable[[], object], timeout: float, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, redis.RedisError):
            if condition():
                return
        time.sleep(0.1)
    raise AssertionError(f"{what} not met in {timeout} s")


def wait_for_sentinels(layout: HaLayout, timeout: float = 60.0) -> None:
    """Until the replica is in sync and every Sentinel knows the rest."""
    def synced() -> bool:
        info = layout.data(layout.replica).info("replication")
        return info.get("master_link_status") == "up"

    wait_until(synced, timeout, "the replica in sync")
    for index in range(len(layout.sentinels)):
        wait_until(lambda i=index: layout.ready(i), timeout, f"Sentinel {index} ready")


@contextlib.contextmanager
def local_ha(tmp_path: Path, down_after_ms: int = 2000) -> Iterator[HaLayout]:
    """A primary, a replica and three Sentinels on loopback; stopped when the block ends."""
    ports = free_ports(5)
    layout = HaLayout(("127.0.0.1", ports[0]), ("127.0.0.1", ports[1]),
                      tuple(("127.0.0.1", p) for p in ports[2:]), down_after_ms=down_after_ms)
    env = {**layout.env}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(spawn_process(layout.primary_argv(tmp_path / "primary"), env,
                                   tmp_path / "primary.log"))
        procs.append(spawn_process(layout.replica_argv(tmp_path / "replica"), env,
                                   tmp_path / "replica.log"))
        for index in range(3):
            procs.append(spawn_process(layout.sentinel_argv(index, tmp_path / f"s{index}"), env,
                                       tmp_path / f"sentinel-{index}.log"))
        wait_for_sentinels(layout)
        yield layout
    finally:
        for process in reversed(procs):
            stop_process(process, timeout=10)
