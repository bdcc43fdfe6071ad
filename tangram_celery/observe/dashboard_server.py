"""``tangram dashboard``: a live page of ACT parts, queues, pool units, resident models and the
slowest recent actions, served by its own small HTTP server (not by the exporter, whose
``/metrics`` has the credentials of its Prometheus scrapers).

Routes: ``/`` the page (:mod:`.dashboard_page`), ``/api/dashboard`` the JSON it polls
(:func:`~tangram_celery.observe.dashboard.gather`), ``/healthz`` a bare ``ok`` for probes.
Authentication follows ``tangram flower``'s rules: basic auth by default, with a generated
password (printed once) when none is set; ``--no-auth`` only on a loopback address.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import redis

from tangram_celery.command_line import run_with_settings
from tangram_celery.connection import connect
from tangram_celery.credentials import authorized, basic_authorization, is_loopback, redact
from tangram_celery.errors import ConfigError
from tangram_celery.observe.dashboard import ViewConfig, gather
from tangram_celery.observe.dashboard_page import PAGE
from tangram_celery.settings import ObserveSettings, Settings

log = logging.getLogger(__name__)

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
                               "style-src 'unsafe-inline'; connect-src 'self'; img-src 'self'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True)
class DashboardConfig:
    """Where the dashboard listens, who may see it (``password=""``: generate one), and what
    it shows."""

    address: str = "127.0.0.1"
    port: int = 9810
    user: str = "tangram"
    password: str = ""
    unauthenticated: bool = False
    view: ViewConfig = field(default_factory=ViewConfig)

    @property
    def url(self) -> str:
        """The page's URL (without credentials)."""
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/"


def resolve_auth(config: DashboardConfig, token: Callable[[], str] = secrets.token_urlsafe
                 ) -> tuple[DashboardConfig, bool]:
    """The config with its password (generated if empty) and whether it was generated; raises
    :class:`ConfigError` when the rules refuse it (no auth off loopback, a bad user name)."""
    if config.unauthenticated:
        if not is_loopback(config.address):
            raise ConfigError(
                f"refusing to serve the dashboard without authentication on "
                f"{config.address or '*'}: keep basic auth (set TANGRAM_DASHBOARD_PASSWORD) or "
                "listen on 127.0.0.1")
        return config, False
    if not config.user or ":" in config.user:
        raise ConfigError("TANGRAM_DASHBOARD_USER must be non-empty, without ':'")
    if config.password:
        return config, False
    return replace(config, password=token()), True


class DashboardServer(ThreadingHTTPServer):
    """The HTTP server: its config, the Redis client and settings the JSON is read with."""

    daemon_threads = True

    def __init__(self, config: DashboardConfig, settings: Settings, client: redis.Redis,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__((config.address, config.port), DashboardHandler)
        self.config = replace(config, port=int(self.server_address[1]))
        self.settings = settings
        self.client = client
        self.clock = clock
        self._expected = (None if config.unauthenticated
                          else basic_authorization(config.user, config.password))

    def allows(self, header: str | None) -> bool:
        """Whether a request with this ``Authorization`` header may see the page."""
        if self._expected is None:
            return True
        return authorized(header, self._expected)

    def view(self) -> dict[str, Any]:
        """The JSON the page draws, read now."""
        return gather(self.client, self.settings, self.clock(), self.config.view)


class DashboardHandler(BaseHTTPRequestHandler):
    """``GET /``, ``GET /api/dashboard`` and ``GET /healthz``."""

    server: DashboardServer

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            self._send(200, b"ok\n", "text/plain; charset=utf-8")
        elif not self.server.allows(self.headers.get("Authorization")):
            self._send(401, b"authentication required\n", "text/plain; charset=utf-8",
                       {"WWW-Authenticate": 'Basic realm="tangram dashboard", charset="UTF-8"'})
        elif path in {"/", "/index.html"}:
            self._send(200, PAGE.encode(), "text/html; charset=utf-8")
        elif path == "/api/dashboard":
            self._send(200, json.dumps(self.server.view()).encode(), "application/json")
        else:
            self._send(404, b"not found\n", "text/plain; charset=utf-8")

    def log_message(self, format: str, *args: Any) -> None:
        """Requests go to the debug log, not stderr."""
        log.debug("%s %s", self.address_string(), redact(format % args))

    def _send(self, code: int, body: bytes, kind: str,
              extra: dict[str, str] | None = None) -> None:
        self.send_response(code)
        for name, value in {**SECURITY_HEADERS, "Content-Type": kind,
                            "Content-Length": str(len(body)), **(extra or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


@contextlib.contextmanager
def dashboard(settings: Settings, config: DashboardConfig) -> Iterator[DashboardServer]:
    """Serve the dashboard from a thread of this process (port 0: a free one) until the block
    ends. ``config`` must be resolved (:func:`resolve_auth`); opens Redis lazily."""
    client = connect(settings.broker, retry_s=0)
    server = DashboardServer(config, settings, client)
    thread = threading.Thread(target=server.serve_forever, name="tangram-dashboard",
                              daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        client.close()


def run_dashboard(settings: Settings, config: DashboardConfig,
                  announce: Callable[[str], None] = print) -> int:
    """``tangram dashboard``: serve until SIGINT or SIGTERM."""
    config, generated = resolve_auth(config)
    done = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: done.set())
    with dashboard(settings, config) as running:
        url = running.config.url
        if config.unauthenticated:
            announce(f"tangram dashboard: {url} (no authentication, loopback only)")
        elif generated:
            announce(f"tangram dashboard: {url} user {config.user!r} password "
                     f"{config.password!r} (generated; set TANGRAM_DASHBOARD_PASSWORD to choose)")
        else:
            announce(f"tangram dashboard: {url} (basic auth, user {config.user!r})")
        done.wait()
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``tangram dashboard``."""
    parser.add_argument("--address", default=None,
                        help="listen address (default TANGRAM_DASHBOARD_ADDRESS, 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None,
                        help="port (default TANGRAM_DASHBOARD_PORT, 9810)")
    parser.add_argument("--user", default=None,
                        help="basic-auth user (default TANGRAM_DASHBOARD_USER, tangram)")
    parser.add_argument("--no-auth", action="store_true",
                        help="no authentication (refused unless --address is loopback)")
    view = ViewConfig()
    parser.add_argument("--window", type=float, default=view.window_s,
                        help=f"seconds of ACT history shown (default {view.window_s:g})")
    parser.add_argument("--slowest", type=int, default=view.slowest,
                        help=f"slowest recent actions listed (default {view.slowest})")


def config_from_args(observe: ObserveSettings, args: argparse.Namespace) -> DashboardConfig:
    """The :class:`DashboardConfig` of parsed :func:`add_arguments` over the settings."""
    if args.window <= 0 or args.slowest < 0:
        raise ConfigError("--window must be > 0 and --slowest >= 0")
    return DashboardConfig(
        address=args.address or observe.dashboard_address,
        port=args.port or observe.dashboard_port, user=args.user or observe.dashboard_user,
        password=observe.dashboard_password, unauthenticated=args.no_auth,
        view=ViewConfig(window_s=args.window, slowest=args.slowest))


def run_from_args(settings: Settings, args: argparse.Namespace) -> int:
    """Run ``tangram dashboard`` with parsed :func:`add_arguments` (messages on stderr)."""
    return run_dashboard(settings, config_from_args(settings.observe, args),
                         announce=lambda line: print(line, file=sys.stderr, flush=True))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m tangram_celery.observe.dashboard_server``."""
    parser = argparse.ArgumentParser(prog="tangram dashboard", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run_with_settings(parser, run_from_args, argv)


if __name__ == "__main__":
    sys.exit(main())
