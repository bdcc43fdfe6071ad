"""``tangram redis``: the broker and result backend as a foreground service.

The local stack (``compose/docker-compose.yml`` and ``tangram up``) runs Redis with this command,
so the server is configured from the same setting its clients read: the port and the password
come from ``TANGRAM_REDIS_URL``. The password reaches ``redis-server`` as configuration on its
standard input, never on its command line. Persistence is an append-only file (``appendfsync
everysec``) in ``--dir``, no RDB snapshots. ``tangram redis --check`` is the healthcheck: it
exits 0 when the Redis at ``TANGRAM_REDIS_URL`` answers PING.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tangram_celery.errors import ConfigError
from tangram_celery.settings import Settings
from tangram_celery.stack.services import redis_answers, redis_server_binary

DEFAULT_PORT = 6379


def listen_port(redis_url: str) -> int:
    """The port a server for ``redis_url`` listens on (the URL's, else 6379)."""
    parts = urlsplit(redis_url)
    if parts.scheme not in {"redis", "rediss"}:
        raise ConfigError(f"tangram redis serves redis:// URLs, not {parts.scheme}://; set "
                          "TANGRAM_REDIS_URL=redis://:PASSWORD@HOST:PORT/0")
    return parts.port or DEFAULT_PORT


def server_config(redis_url: str) -> str:
    """The configuration text fed on stdin: the URL's password (``requirepass``), if any."""
    password = urlsplit(redis_url).password
    if not password:
        return ""
    password = unquote(password)
    if any(ch in password for ch in "\"\\\n\r"):
        raise ConfigError("the Redis password in TANGRAM_REDIS_URL must not contain quotes, "
                          "backslashes or newlines")
    return f'requirepass "{password}"\n'


def server_argv(binary: str, port: int, bind: str, data_dir: Path) -> list[str]:
    """``redis-server`` arguments: configuration from stdin (``-``), then the listener and the
    append-only persistence in ``data_dir``."""
    return [binary, "-", "--port", str(port), "--bind", bind, "--dir", str(data_dir),
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
            "--logfile", ""]


def exec_redis(settings: Settings, bind: str, data_dir: Path) -> None:
    """Replace this process with ``redis-server`` (so it receives the stop signals itself)."""
    config = server_config(settings.redis_url).encode()
    argv = server_argv(redis_server_binary(), listen_port(settings.redis_url), bind, data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    read_end, write_end = os.pipe()
    os.write(write_end, config)  # a few bytes: far below the pipe's buffer
    os.close(write_end)
    os.dup2(read_end, 0)
    os.close(read_end)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)  # nosec B606 # argv of the redis-server binary found on this host


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``tangram redis``."""
    parser.add_argument("--bind", default="127.0.0.1",
                        help="listen address (default 127.0.0.1); the port is TANGRAM_REDIS_URL's")
    parser.add_argument("--dir", type=Path, default=Path("."),
                        help="where the append-only file lives (default: here)")
    parser.add_argument("--check", action="store_true",
                        help="exit 0 when the Redis at TANGRAM_REDIS_URL answers PING, else 1")


def run_from_args(settings: Settings, args: argparse.Namespace) -> int:
    """Run ``tangram redis`` with parsed :func:`add_arguments`."""
    if args.check:
        return 0 if redis_answers(settings.redis_url, timeout=2.0) else 1
    exec_redis(settings, args.bind, args.dir)
    return 0  # not reached: exec_redis does not return


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m tangram_celery.stack.broker``."""
    parser = argparse.ArgumentParser(prog="tangram redis", description=__doc__)
    add_arguments(parser)
    return run_from_args(Settings.from_env(), parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
