"""The exporter's HTTP server: Prometheus' WSGI app, behind basic auth when it has a password.

:func:`serve_metrics` serves a registry from a thread. With ``authorization`` (the
``Authorization`` header value a scraper must send) every path answers 401 to a request
without it; requests go to the debug log with secrets masked
(:func:`~tangram_celery.credentials.redact`).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from tangram_celery.credentials import authorized, redact

log = logging.getLogger(__name__)
REALM = 'Basic realm="tangram exporter", charset="UTF-8"'
Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), redact(format % args))


def guarded(app: Wsgi, authorization: str | None) -> Wsgi:
    """``app`` answering 401 to requests without ``authorization`` (None: ``app`` itself)."""
    if authorization is None:
        return app
    expected = authorization

    def guard(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if authorized(environ.get("HTTP_AUTHORIZATION"), expected):
            return app(environ, start_response)
        start_response("401 Unauthorized", [("Content-Type", "text/plain; charset=utf-8"),
                                            ("WWW-Authenticate", REALM)])
        return [b"authentication required\n"]

    return guard


def serve_metrics(registry: CollectorRegistry, address: str, port: int,
                  authorization: str | None) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``registry`` on ``address:port`` (port 0: a free one) from a daemon thread."""
    server_class = _Server6 if ":" in address else _Server
    app = guarded(make_wsgi_app(registry), authorization)
    server = make_server(address, port, app, server_class, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="tangram-exporter-http",
                              daemon=True)
    thread.start()
    return server, thread
