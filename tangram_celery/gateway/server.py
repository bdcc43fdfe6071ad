"""The gateway's HTTP server: SandboxFusion's endpoints over a threading HTTP/1.1 server.

    POST   /run_code                  SandboxFusion's RunCodeRequest -> RunCodeResponse
    POST   /run_jupyter               SandboxFusion's RunJupyterRequest -> RunJupyterResponse
    POST   /get_reward                OpenRLHF's remote reward: query, prompts, labels -> rewards
    GET    /v1/ping                   the JSON string "pong", as SandboxFusion answers
    GET    /healthz                   {"status": "ok", ...}
    DELETE /v1/trajectories/NAME      end a trajectory kept with X-Tangram-Trajectory: NAME

Headers: ``Authorization: Bearer TOKEN`` (required on ``/run_code`` and ``/v1/trajectories`` when
``TANGRAM_GATEWAY_TOKEN`` is set; clients that cannot add a header, as verl's, put ``?token=TOKEN``
in the URL instead; those that take only a base URL, as SandboxFusion's own client, use
``http://tangram:TOKEN@HOST:PORT``, Basic credentials whose password is the token),
``X-Tangram-Trajectory: NAME`` (keep the request's trajectory, its files, for the next request
naming it), ``X-Tangram-Session: 1`` (with a trajectory name and ``python``: the code runs in the
trajectory's Python session, whose variables, imports and cwd live from one request to the next),
``X-Tangram-Signature: SIG`` (the key of a ``pytest`` run's learned durations). One thread per
connection: a request waits for its actions while hundreds of others wait beside it, and the listen
backlog holds a burst, so a busy pool makes requests slow, never refused. Errors are JSON: 422 for
a bad body or header (with FastAPI's ``detail``, as SandboxFusion answers), 401 without the token,
404 for an unknown path, 501 for SandboxFusion endpoints not served here; a request the gateway
fails on is answered ``SandboxError``, as SandboxFusion does, never 500. A ``/run_code`` answer
carries ``X-Tangram-Timings``: its seconds in the gateway, the broker, the sandbox and the program.
"""

from __future__ import annotations

import base64
import hmac
import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tangram_celery.credentials import redact
from tangram_celery.errors import GatewayRequestError, TangramError
from tangram_celery.gateway.jupyter import parse_jupyter_request
from tangram_celery.gateway.protocol import parse_run_request, sandbox_error
from tangram_celery.gateway.reward import RewardService, parse_reward_request
from tangram_celery.gateway.service import TIMINGS, RunCodeService

log = logging.getLogger(__name__)
SERVED = ("POST /run_code", "POST /run_jupyter", "POST /get_reward", "GET /v1/ping", "GET /healthz",
          "DELETE /v1/trajectories/NAME")
NOT_SERVED = frozenset({
    "/submit", "/get_prompts", "/get_prompt_by_id", "/list_datasets",
    "/list_ids", "/get_metrics", "/get_metrics_function", "/submit_safe",
})
"""SandboxFusion endpoints that the gateway does not serve (its notebook and dataset APIs)."""
TRAJECTORIES = "/v1/trajectories/"
BACKLOG = 1024
MAX_BODY_BYTES = 16 * 1024 * 1024
CONNECTION_IDLE_S = 120.0


class GatewayHTTPServer(ThreadingHTTPServer):
    """The listening server; ``service`` runs the requests, ``token`` guards them."""

    daemon_threads = True
    request_queue_size = BACKLOG

    def __init__(self, address: tuple[str, int], service: RunCodeService, token: str,
                 rewards: RewardService | None = None) -> None:
        super().__init__(address, GatewayHandler)
        self.service = service
        self.token = token
        self.rewards = rewards

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` of the listening socket."""
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"


class GatewayHandler(BaseHTTPRequestHandler):
    """One connection: SandboxFusion's routes, JSON in and out."""

    protocol_version = "HTTP/1.1"
    server_version = "tangram-gateway"
    timeout = CONNECTION_IDLE_S
    server: GatewayHTTPServer

    def do_GET(self) -> None:
        path = self._path()
        if path == "/v1/ping":
            self._json(200, "pong")
        elif path == "/healthz":
            service = self.server.service
            self._json(200, {"status": "ok", "in_flight": service.in_flight,
                             "served": service.served, "languages": list(service.languages)})
        else:
            self._unknown(path, "GET")

    def do_POST(self) -> None:
        path = self._path()
        if path == "/get_reward" and self.server.rewards is not None:
            self._reward(self.server.rewards)
            return
        if path not in ("/run_code", "/run_jupyter"):
            self._drain()
            self._unknown(path, "POST")
            return
        if not self._authorized():
            return
        body = self._body()
        if body is None:
            return
        try:
            if path == "/run_jupyter":
                response = self.server.service.run_jupyter(parse_jupyter_request(body))
                self._json(200, response)
                return
            request = parse_run_request(body)
            response = self.server.service.run(
                request, self.headers.get("X-Tangram-Trajectory"),
                self.headers.get("X-Tangram-Signature"),
                session=bool(self.headers.get("X-Tangram-Session")))
        except GatewayRequestError as exc:
            self._json(422, unprocessable(exc))
            return
        except Exception as exc:
            log.exception("gateway request failed")
            response = sandbox_error(f"tangram gateway failed on this request: {exc}")
        split = response.pop(TIMINGS, None)
        extra = None if split is None else {"X-Tangram-Timings": json.dumps(split)}
        self._json(200, response, extra)

    def _reward(self, rewards: RewardService) -> None:
        """OpenRLHF's ``/get_reward`` (see :mod:`~tangram_celery.gateway.reward`)."""
        if not self._authorized():
            return
        body = self._body()
        if body is None:
            return
        try:
            answer = rewards.rewards(parse_reward_request(body))
        except GatewayRequestError as exc:
            self._json(422, unprocessable(exc))
        except (TangramError, OSError) as exc:
            self._json(503, {"error": f"tangram could not score the request: {exc}"})
        else:
            self._json(200, answer)

    def do_DELETE(self) -> None:
        path = self._path()
        if not path.startswith(TRAJECTORIES):
            self._unknown(path, "DELETE")
            return
        if not self._authorized():
            return
        try:
            ended = self.server.service.end(path[len(TRAJECTORIES):])
        except GatewayRequestError as exc:
            self._json(422, unprocessable(exc))
            return
        self._json(200, {"ended": ended})

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), redact(format % args))

    def _path(self) -> str:
        return self.path.split("?", 1)[0].rstrip("/") or "/"

    def _authorized(self) -> bool:
        token = self.server.token
        if not token:
            return True
        given = _given_token(self.headers.get("Authorization", ""), self.path)
        if given is not None and hmac.compare_digest(given.encode(), token.encode()):
            return True
        self._drain()
        self._json(401, {"error": "missing or wrong token: send 'Authorization: Bearer "
                                  "<TANGRAM_GATEWAY_TOKEN>' or add ?token=<it> to the URL"},
                   extra={"WWW-Authenticate": 'Bearer realm="tangram-gateway"'})
        return False

    def _body(self) -> bytes | None:
        raw = self.headers.get("Content-Length")
        if raw is None or not raw.isdigit():
            self._json(411, {"error": "a Content-Length header is required (a JSON body)"},
                       close=True)
            return None
        length = int(raw)
        if length > MAX_BODY_BYTES:
            self._json(413, {"error": f"body of {length} bytes is over the "
                                      f"{MAX_BODY_BYTES}-byte limit; ship smaller files"},
                       close=True)
            return None
        return self.rfile.read(length)

    def _drain(self) -> None:
        raw = self.headers.get("Content-Length", "0")
        if raw.isdigit() and int(raw) <= MAX_BODY_BYTES:
            self.rfile.read(int(raw))
        else:
            self.close_connection = True

    def _unknown(self, path: str, method: str) -> None:
        if path in NOT_SERVED:
            self._json(501, {"error": f"{path} is a SandboxFusion endpoint that tangram gateway "
                                      "does not serve", "served": list(SERVED)})
            return
        self._json(404, {"error": f"no endpoint {method} {path}", "served": list(SERVED)})

    def _json(self, status: int, body: Any, extra: dict[str, str] | None = None,
              close: bool = False) -> None:
        self._send(status, json.dumps(body), "application/json", extra, close)

    def _send(self, status: int, text: str, content_type: str,
              extra: dict[str, str] | None = None, close: bool = False) -> None:
        data = text.encode("utf-8", "surrogateescape")
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)


def unprocessable(exc: GatewayRequestError) -> dict[str, Any]:
    """The 422 body FastAPI gives a request its model refuses (``detail``), with tangram's
    one-line ``error`` and ``field`` beside it."""
    where = ["body", *(p for p in exc.field.split(".", 1) if exc.field != "body")]
    return {"detail": [{"loc": where, "msg": exc.reason, "type": "value_error"}],
            "error": str(exc), "field": exc.field}


def _given_token(header: str, path: str) -> str | None:
    """The token a request gives: ``Bearer TOKEN``, the password of ``Basic`` credentials (a
    client that takes only a base URL: ``http://tangram:TOKEN@HOST:PORT``) or ``?token=``."""
    if header.startswith("Bearer "):
        return header[7:]
    if header.startswith("Basic "):
        try:
            return base64.b64decode(header[6:], validate=True).decode().partition(":")[2]
        except (ValueError, UnicodeDecodeError):
            return None
    return _query_token(path)


def _query_token(path: str) -> str | None:
    values = parse_qs(urlsplit(path).query).get("token")
    return values[0] if values else None


def serve_in_thread(server: GatewayHTTPServer) -> Callable[[], None]:
    """Serve in a daemon thread; returns the function that stops it."""
    thread = threading.Thread(target=server.serve_forever, name="tangram-gateway-http",
                              daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(10)

    return stop
