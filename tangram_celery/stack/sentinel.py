"""``tangram sentinel``: one Redis Sentinel watching tangram's primary, in the foreground.

A Sentinel-managed Redis is a primary (``tangram redis``), its replica (``tangram redis
--replica-of PRIMARY``) and three Sentinels (``tangram sentinel --monitor PRIMARY``); clients
name the Sentinels in ``TANGRAM_REDIS_URL=sentinel://...`` and follow whichever data node they
promote. The Sentinel runs ``redis-server CONFIG --sentinel``. Its configuration file, with the
data nodes' password (``sentinel auth-pass``) and its own (``requirepass``,
``TANGRAM_REDIS_SENTINEL_PASSWORD``), is written in ``--dir`` with mode 0600 and nothing secret
reaches the command line. Sentinel rewrites that file as it learns the replicas, the other
Sentinels and each promotion, so a restarted Sentinel keeps following the current primary: an
existing file is kept (``tangram down -v`` removes the volumes and with them this state).
Off loopback a Sentinel refuses to run without a password of its own.

``tangram sentinel --check`` exits 0 when this host's Sentinel answers and names a primary.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import redis

from tangram_celery.connection import sentinel_client
from tangram_celery.credentials import is_loopback
from tangram_celery.errors import ConfigError
from tangram_celery.settings import BrokerSettings, Settings
from tangram_celery.stack.broker import (
    data_password,
    exec_with_stdin,
    parse_address,
    redis_server_binary,
)

DEFAULT_PORT = 26379
CONFIG_NAME = "sentinel.conf"
DOWN_AFTER_MS = 3000
FAILOVER_TIMEOUT_MS = 10000


def sentinel_config(broker: BrokerSettings, monitor: tuple[str, int], port: int, bind: str,
                    data_dir: Path, quorum: int = 2, down_after_ms: int = DOWN_AFTER_MS,
                    announce_ip: str | None = None) -> str:
    """The text of a Sentinel's configuration file."""
    name = broker.master_name
    if not name.replace("-", "").replace("_", "").isalnum():
        raise ConfigError(f"TANGRAM_REDIS_MASTER_NAME={name!r}: use letters, digits, - and _")
    lines = [
        f"port {port}", f"bind {bind}", f'dir "{data_dir}"', 'logfile ""',
        "sentinel resolve-hostnames yes",
        f"sentinel monitor {name} {monitor[0]} {monitor[1]} {quorum}",
        f"sentinel down-after-milliseconds {name} {down_after_ms}",
        f"sentinel failover-timeout {name} {FAILOVER_TIMEOUT_MS}",
        f"sentinel parallel-syncs {name} 1",
    ]
    password = data_password(broker.redis_url)
    if password:
        lines.append(f'sentinel auth-pass {name} "{password}"')
    own = broker.sentinel_password
    if own:
        if any(ch in own for ch in "\"\\\n\r"):
            raise ConfigError("TANGRAM_REDIS_SENTINEL_PASSWORD must not contain quotes, "
                              "backslashes or newlines")
        lines += [f'requirepass "{own}"', f'sentinel sentinel-pass "{own}"']
    if announce_ip:
        lines.append(f"sentinel announce-ip {announce_ip}")
    return "".join(line + "\n" for line in lines)


def write_config(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` with mode 0600, in a directory only its owner reads (Sentinel
    rewrites the file with its default mode), unless the file exists (Sentinel's own rewrites
    are its state); returns whether it was written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as out:
        out.write(text)
    return True


def check_bind(broker: BrokerSettings, bind: str) -> None:
    """Refuse a Sentinel off loopback without a password of its own: whoever reaches it could
    otherwise reconfigure it or trigger failovers."""
    if not broker.sentinel_password and not all(is_loopback(a) for a in bind.split()):
        raise ConfigError(f"tangram sentinel --bind {bind} listens off loopback without a "
                          "password; set TANGRAM_REDIS_SENTINEL_PASSWORD or bind 127.0.0.1")


def sentinel_answers(broker: BrokerSettings, port: int, timeout: float = 2.0) -> bool:
    """Whether the Sentinel on this host's ``port`` answers and names a primary."""
    client = sentinel_client(broker, "127.0.0.1", port, timeout)
    try:
        return bool(client.sentinel_get_master_addr_by_name(broker.master_name))
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``tangram sentinel``."""
    parser.add_argument("--monitor", type=parse_address, metavar="HOST:PORT",
                        help="the primary to watch at first (required unless --check)")
    parser.add_argument("--quorum", type=int, default=2,
                        help="Sentinels that must agree the primary is down (default 2 of 3)")
    parser.add_argument("--bind", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"listen port (default {DEFAULT_PORT})")
    parser.add_argument("--dir", type=Path, default=Path("."),
                        help="where its configuration file (its state) lives (default: here)")
    parser.add_argument("--down-after-ms", type=int, default=DOWN_AFTER_MS,
                        help=f"silence before the primary counts as down (default "
                             f"{DOWN_AFTER_MS} ms)")
    parser.add_argument("--announce-ip", default=None,
                        help="the address other Sentinels and clients reach this one at")
    parser.add_argument("--check", action="store_true",
                        help="exit 0 when this host's Sentinel on --port names a primary")


def run_from_args(settings: Settings, args: argparse.Namespace) -> int:
    """Run ``tangram sentinel`` with parsed :func:`add_arguments`."""
    broker = settings.broker
    if args.check:
        return 0 if sentinel_answers(broker, args.port) else 1
    if args.monitor is None:
        raise ConfigError("tangram sentinel needs --monitor HOST:PORT (the primary to watch)")
    check_bind(broker, args.bind)
    data_dir = args.dir.resolve()
    path = data_dir / CONFIG_NAME
    write_config(path, sentinel_config(broker, args.monitor, args.port, args.bind, data_dir,
                                       args.quorum, args.down_after_ms, args.announce_ip))
    exec_with_stdin([redis_server_binary(), str(path), "--sentinel"], b"")
    return 0  # not reached
