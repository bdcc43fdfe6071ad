"""``tangram flower``: Flower on tangram's broker, with basic auth unless explicitly turned off.

Tangram's tasks show in Flower as ``tangram.action.<kind>`` with a short argument summary
(trajectory, kind, units) and the result's ACT parts first in its repr. Workers run with ``-E``
and producers with ``task_send_sent_event``, so Flower has received, started and sent times.

Authentication rules (:func:`resolve_auth`):

* basic auth by default, as ``user``/``password``; with no password one is generated and
  printed once at start (like a notebook token);
* ``unauthenticated=True`` opens Flower (and its HTTP API) without auth, and is refused unless
  the address is a loopback one.

Flower keeps what it shows in memory: tasks that finished before it started are not listed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from tangram_celery.command_line import run_with_settings
from tangram_celery.credentials import basic_authorization, is_loopback
from tangram_celery.errors import ConfigError, ServiceError
from tangram_celery.processes import free_port, stop_process
from tangram_celery.settings import Settings
from tangram_celery.tasks.app import make_app

DEFAULT_FLOWER_ADDRESS = "127.0.0.1"
DEFAULT_FLOWER_PORT = 5555
DEFAULT_FLOWER_USER = "tangram"
START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class FlowerConfig:
    """Where Flower listens and who may see it (``password=""``: generate one)."""

    address: str = DEFAULT_FLOWER_ADDRESS
    port: int = DEFAULT_FLOWER_PORT
    user: str = DEFAULT_FLOWER_USER
    password: str = ""
    unauthenticated: bool = False
    url_prefix: str = ""

    @property
    def url(self) -> str:
        """The base URL (without credentials)."""
        host = f"[{self.address}]" if ":" in self.address else self.address
        prefix = f"/{self.url_prefix.strip('/')}" if self.url_prefix.strip("/") else ""
        return f"http://{host}:{self.port}{prefix}"


def resolve_auth(config: FlowerConfig, token: Callable[[], str] = secrets.token_urlsafe
                 ) -> tuple[FlowerConfig, bool]:
    """Check the auth rules; returns the config with its password (generated if empty) and
    whether it was generated. Raises :class:`ConfigError` naming what to change."""
    if config.unauthenticated:
        if not is_loopback(config.address):
            raise ConfigError(
                f"refusing to start Flower without authentication on {config.address or '*'}: "
                "it would expose every task's arguments and results; keep basic auth (set "
                "TANGRAM_FLOWER_PASSWORD) or listen on 127.0.0.1"
            )
        return config, False
    if not config.user or ":" in config.user or "," in config.user:
        raise ConfigError("TANGRAM_FLOWER_USER must be non-empty, without ':' or ','")
    if "," in config.password:
        raise ConfigError("TANGRAM_FLOWER_PASSWORD must not contain ',' (Flower splits on it)")
    if config.password:
        return config, False
    return replace(config, password=token()), True


def flower_argv(config: FlowerConfig) -> list[str]:
    """The ``celery flower`` arguments of a resolved config (address and port always given, so
    a ``FLOWER_ADDRESS`` in the environment cannot widen them)."""
    argv = ["flower", f"--address={config.address}", f"--port={config.port}"]
    if not config.unauthenticated:
        argv.append(f"--basic-auth={config.user}:{config.password}")
    if config.url_prefix.strip("/"):
        argv.append(f"--url-prefix={config.url_prefix.strip('/')}")
    return argv


def run_flower(
    settings: Settings,
    *,
    address: str = DEFAULT_FLOWER_ADDRESS,
    port: int = DEFAULT_FLOWER_PORT,
    user: str = DEFAULT_FLOWER_USER,
    password: str = "",
    unauthenticated: bool = False,
    url_prefix: str = "",
    announce: Callable[[str], None] = print,
) -> int:
    """``tangram flower``: run Flower on the configured broker in this process until stopped.

    Raises :class:`ConfigError` (before anything starts) when the auth rules refuse the config.
    """
    config, generated = resolve_auth(FlowerConfig(address, port, user, password,
                                                  unauthenticated, url_prefix))
    if config.unauthenticated:
        os.environ["FLOWER_UNAUTHENTICATED_API"] = "true"
        announce(f"tangram flower: {config.url} (no authentication, loopback only)")
    elif generated:
        announce(f"tangram flower: {config.url} user {config.user!r} password "
                 f"{config.password!r} (generated; set TANGRAM_FLOWER_PASSWORD to choose one)")
    else:
        announce(f"tangram flower: {config.url} (basic auth, user {config.user!r})")
    app = make_app(settings)
    return int(app.start(flower_argv(config)) or 0)


@dataclass(frozen=True)
class FlowerHandle:
    """A Flower started by :func:`flower_process`."""

    config: FlowerConfig
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        """The base URL (without credentials)."""
        return self.config.url

    def authorization(self) -> str:
        """The ``Authorization`` header value of its credentials."""
        return basic_authorization(self.config.user, self.config.password)


@contextlib.contextmanager
def flower_process(
    settings: Settings,
    *,
    port: int | None = None,
    user: str = DEFAULT_FLOWER_USER,
    password: str | None = None,
    log_path: Path | None = None,
    timeout: float = START_TIMEOUT_S,
) -> Iterator[FlowerHandle]:
    """Run ``tangram flower`` as a subprocess on 127.0.0.1 with basic auth; yields once it
    answers HTTP; stops it afterwards. The password (random unless given) reaches it on stdin,
    never on its command line."""
    config = FlowerConfig(port=port or free_port(), user=user,
                          password=password or secrets.token_urlsafe())
    argv = [sys.executable, "-m", "tangram_celery.observe.flower", "--address", config.address,
            "--port", str(config.port), "--user", config.user, "--password-stdin"]
    output = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    try:
        process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=output,
                                   stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ,
                                        "TANGRAM_REDIS_URL": settings.broker.redis_url,
                                        "TANGRAM_RESULT_URL": settings.broker.result_url})
    finally:
        if log_path:
            output.close()  # type: ignore[union-attr]
    assert process.stdin is not None
    process.stdin.write(config.password.encode() + b"\n")
    process.stdin.close()
    try:
        wait_for_http(config.url + "/", process, timeout)
        yield FlowerHandle(config, process)
    finally:
        stop_process(process)


def wait_for_http(url: str, process: subprocess.Popen[bytes] | None = None,
                  timeout: float = START_TIMEOUT_S) -> None:
    """Block until ``url`` gives any HTTP answer (a 401 counts); raises :class:`ServiceError`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise ServiceError(f"flower exited with {process.returncode} before answering")
        try:
            with urllib.request.urlopen(url, timeout=1.0):  # nosec B310 # url is http://ADDRESS:PORT built here from the config
                return
        except urllib.error.HTTPError:
            return
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    raise ServiceError(f"flower did not answer on {url} within {timeout} s")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``tangram flower`` (also ``python -m tangram_celery.observe.flower``)."""
    parser.add_argument("--address", default=None,
                        help="listen address (default TANGRAM_FLOWER_ADDRESS, 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None,
                        help="port (default TANGRAM_FLOWER_PORT, 5555)")
    parser.add_argument("--user", default=None,
                        help="basic-auth user (default TANGRAM_FLOWER_USER, tangram)")
    parser.add_argument("--password-stdin", action="store_true",
                        help="read the basic-auth password from the first line of stdin "
                             "(default: TANGRAM_FLOWER_PASSWORD, else generate one and print it)")
    parser.add_argument("--no-auth", action="store_true",
                        help="no authentication (refused unless --address is loopback)")
    parser.add_argument("--url-prefix", default="", help="serve under this path prefix")


def run_from_args(settings: Settings, args: argparse.Namespace) -> int:
    """Run ``tangram flower`` with parsed :func:`add_arguments` (its messages on stderr)."""
    password = (sys.stdin.readline().rstrip("\r\n") if args.password_stdin
                else settings.observe.flower_password)
    return run_flower(settings, address=args.address or settings.observe.flower_address,
                      port=args.port or settings.observe.flower_port,
                      user=args.user or settings.observe.flower_user,
                      password=password, unauthenticated=args.no_auth,
                      url_prefix=args.url_prefix,
                      announce=lambda line: print(line, file=sys.stderr, flush=True))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m tangram_celery.observe.flower``."""
    parser = argparse.ArgumentParser(prog="tangram flower", description=run_flower.__doc__)
    add_arguments(parser)
    return run_with_settings(parser, run_from_args, argv)


if __name__ == "__main__":
    sys.exit(main())
