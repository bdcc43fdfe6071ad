"""The API pool runtime: what a basic (quota-limited) worker does with each ``api`` action.

Like a CPU node it validates the message again, waits in its gate (oldest trajectory first,
until the basic manager grants every API the action's cost names), runs the action, gives the
slots back whatever happens, and returns an :class:`~tangram_celery.action.ActionResult` with the
same timestamps, so ACT splits into queue / exec / overhead exactly as for CPU actions.

An ``api`` action's payload is one call or a list of calls, run in order while the action holds
its APIs::

    {"api": "search", "method": "GET", "path": "/search", "params": {"q": "tangram"}}
    {"calls": [{"api": "search", "path": "/search", "params": {"q": "x"}},
               {"api": "judge", "method": "POST", "path": "/score", "json": {"text": "..."}}]}

``api`` may be left out when the action names a single API. A call only ever reaches a path below
the API's declared base URL (``TANGRAM_API_LIMITS``): no host, scheme, ``..`` or redirect from a
payload is followed (no SSRF). Run one worker per API::

    python -m tangram_celery.pools.api_pool --api search   # or: python workers/api_pool.py --api
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import logging
import math
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlencode, urlsplit

import redis
from celery import Celery

from tangram_celery import keys
from tangram_celery.action import (
    Action,
    ActionLimits,
    ActionResult,
    Timings,
    parse_action,
)
from tangram_celery.errors import ConfigError, ServiceError, TangramError, ValidationError
from tangram_celery.managers.basic import (
    ApiGate,
    ApiSpec,
    Need,
    QuotaStore,
    needs_of,
    parse_api_limits,
)
from tangram_celery.pools.conversion import action_limits
from tangram_celery.pools.serving import rejected_result, serve
from tangram_celery.settings import Settings

METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"})
MAX_CALLS = 16
MAX_HEADERS = 32
FORBIDDEN_HEADERS = frozenset({
    "host", "content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer",
    "keep-alive", "expect", "proxy-authorization", "proxy-connection",
})
CALL_FIELDS = frozenset({"api", "method", "path", "params", "json", "headers"})
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")
_PATH = re.compile(r"^/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*$")


# --------------------------------------------------------------------------- pure: calls


@dataclass(frozen=True)
class ApiCall:
    """One HTTP call of an action, relative to its API's base URL."""

    api: str
    method: str = "GET"
    path: str = "/"
    params: tuple[tuple[str, str], ...] = ()
    body: bytes | None = None
    headers: tuple[tuple[str, str], ...] = ()


def parse_calls(action: Action) -> tuple[ApiCall, ...]:
    """The calls of an ``api`` action's payload; :class:`ValidationError` names a bad field."""
    payload = action.payload
    if "calls" in payload:
        if set(payload) != {"calls"}:
            raise ValidationError("payload", "give either one call or only 'calls'")
        raw_calls = payload["calls"]
        if not isinstance(raw_calls, list) or not 1 <= len(raw_calls) <= MAX_CALLS:
            raise ValidationError("payload.calls", f"expected a list of 1-{MAX_CALLS} calls")
        return tuple(_call(action, f"payload.calls.{k}", c) for k, c in enumerate(raw_calls))
    return (_call(action, "payload", payload),)


def _call(action: Action, where: str, raw: Any) -> ApiCall:
    if not isinstance(raw, Mapping):
        raise ValidationError(where, "a call is an object with at least a 'path'")
    extra = sorted(set(raw) - CALL_FIELDS)
    if extra:
        raise ValidationError(f"{where}.{extra[0]}", f"unknown field; known: {sorted(CALL_FIELDS)}")
    apis = action.apis()
    api = raw.get("api", apis[0] if len(apis) == 1 else None)
    if api not in apis:
        raise ValidationError(f"{where}.api", f"must name one of the action's APIs {list(apis)}")
    method = raw.get("method", "GET")
    if method not in METHODS:
        raise ValidationError(f"{where}.method", f"one of {sorted(METHODS)}")
    body = None
    if "json" in raw:
        body = json.dumps(raw["json"], separators=(",", ":")).encode()
    return ApiCall(str(api), str(method), _path(where, raw.get("path")),
                   _params(where, raw.get("params", {})), body,
                   _headers(where, raw.get("headers", {}), body is not None))


def _path(where: str, raw: Any) -> str:
    if not isinstance(raw, str) or not _PATH.fullmatch(raw) or raw.startswith("//"):
        raise ValidationError(f"{where}.path", "an absolute path below the API's base URL, "
                              "like /search (no host, scheme, query or fragment)")
    segments = unquote(raw).split("/")
    if any(s in {".", ".."} for s in segments) or "\\" in unquote(raw):
        raise ValidationError(f"{where}.path", "'.' and '..' segments are not allowed")
    return raw


def _params(where: str, raw: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, Mapping):
        raise ValidationError(f"{where}.params", "expected an object of name -> value(s)")
    pairs: list[tuple[str, str]] = []
    for name, value in raw.items():
        values = value if isinstance(value, list) else [value]
        for item in values:
            if not isinstance(item, str | int | float | bool):
                raise ValidationError(f"{where}.params.{name}", "values are text or numbers")
            pairs.append((str(name), json.dumps(item) if isinstance(item, bool) else str(item)))
    return tuple(pairs)


def _headers(where: str, raw: Any, has_json: bool) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, Mapping) or len(raw) > MAX_HEADERS:
        raise ValidationError(f"{where}.headers", f"expected an object of at most {MAX_HEADERS} "
                              "name -> text")
    headers: list[tuple[str, str]] = []
    for name, value in raw.items():
        if (not isinstance(name, str) or not _HEADER_NAME.fullmatch(name)
                or name.lower() in FORBIDDEN_HEADERS):
            raise ValidationError(f"{where}.headers.{name}", "not an allowed header name")
        if not isinstance(value, str) or any(c in value for c in "\r\n\x00"):
            raise ValidationError(f"{where}.headers.{name}", "values are one line of text")
        headers.append((name, value))
    if has_json and not any(n.lower() == "content-type" for n, _ in headers):
        headers.append(("Content-Type", "application/json"))
    return tuple(headers)


def call_url(spec: ApiSpec, call: ApiCall) -> str:
    """The full URL of ``call``: the API's base URL, the call's path, its query.

    Raises :class:`ValidationError` if the result would leave the base URL (a defence in depth
    behind :func:`parse_calls`).
    """
    base = urlsplit(spec.base_url)
    url = spec.base_url + call.path
    if call.params:
        url += "?" + urlencode(call.params)
    parts = urlsplit(url)
    prefix = base.path.rstrip("/") + "/"
    if (parts.scheme, parts.netloc) != (base.scheme, base.netloc) \
            or not parts.path.startswith(prefix):
        raise ValidationError("payload.path", f"{call.path!r} leaves the API's base URL")
    return url


# --------------------------------------------------------------------------- I/O: HTTP


@dataclass(frozen=True)
class HttpReply:
    """What an HTTP call returned (the body read up to a cap)."""

    status: int
    body: bytes
    truncated: bool
    content_type: str
    elapsed_s: float


def http_call(url: str, method: str = "GET", body: bytes | None = None,
              headers: Sequence[tuple[str, str]] = (), timeout_s: float = 30.0,
              cap_bytes: int = 65536) -> HttpReply:
    """One HTTP request, no redirects followed; raises ``TimeoutError`` or ``OSError``."""
    parts = urlsplit(url)
    connection_class = (http.client.HTTPSConnection if parts.scheme == "https"
                        else http.client.HTTPConnection)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    started = time.perf_counter()
    connection = connection_class(parts.hostname or "", parts.port, timeout=timeout_s)
    try:
        connection.request(method, target, body=body, headers=dict(headers))
        response = connection.getresponse()
        data = response.read(cap_bytes + 1)
    except http.client.HTTPException as exc:
        raise OSError(f"bad HTTP answer: {exc!r}") from None
    finally:
        connection.close()
    return HttpReply(response.status, data[:cap_bytes], len(data) > cap_bytes,
                     response.getheader("Content-Type") or "", time.perf_counter() - started)


def reply_output(call: ApiCall, reply: HttpReply) -> dict[str, Any]:
    """The JSON output of one call: status, body text, parsed JSON when the body is JSON."""
    out: dict[str, Any] = {
        "api": call.api, "method": call.method, "path": call.path,
        "status_code": reply.status, "body": reply.body.decode(errors="replace"),
        "body_truncated": reply.truncated, "elapsed_s": reply.elapsed_s,
    }
    if "json" in reply.content_type and not reply.truncated:
        with contextlib.suppress(ValueError):
            out["json"] = json.loads(reply.body)
    return out


# --------------------------------------------------------------------------- the runtime


class ApiPool:
    """The runtime of one API worker: its manager gate, and the HTTP calls of its actions."""

    def __init__(self, settings: Settings, api: str, gate: ApiGate, name: str = "") -> None:
        self.settings = settings
        self.specs = gate.store.specs
        if api not in self.specs:
            raise ConfigError(
                f"API {api!r} is not declared in TANGRAM_API_LIMITS (declared: "
                f"{sorted(self.specs) or 'none'}); add {api}=url:...,concurrency:N or rate:N/1s"
            )
        self.api = api
        self.spec = self.specs[api]
        self.gate = gate
        self.name = name or f"api-{api}@{socket.gethostname()}"
        self._limits = action_limits(settings)

    def start(self) -> None:
        """Start the gate's pump."""
        self.gate.start()

    def stop(self) -> None:
        """Stop the gate (waiting actions get an error result)."""
        self.gate.stop()

    def end_trajectory(self, trajectory_id: str) -> None:
        """Nothing to free: API actions keep no per-trajectory environment."""

    def execute(self, message: Mapping[str, Any], received: float) -> dict[str, Any]:
        """Run one action message to completion; never raises for a bad message."""
        try:
            action = parse_action(message, self._limits)
            if action.pool != "api":
                raise ValidationError("kind", f"{action.kind} actions do not run on API pools")
            calls = parse_calls(action)
            needs = needs_of(action, self.specs)
        except ValidationError as exc:
            return rejected_result(message, str(exc), self.name, received)
        return self._run(action, calls, needs, received).to_json()

    def _run(self, action: Action, calls: Sequence[ApiCall], needs: Sequence[Need],
             received: float) -> ActionResult:
        timings = Timings(received=received)
        result = ActionResult(action.id, action.trajectory_id, action.kind, "error",
                              node=self.name, timings=timings)
        try:
            grant = self.gate.acquire(action.id, needs, trajectory=action.trajectory_id)
        except (redis.RedisError, TangramError) as exc:
            result.error = f"could not get the API slots: {exc}"
            timings.admitted = timings.exec_started = timings.exec_finished = time.time()
            timings.stored = time.time()
            return result
        timings.admitted = time.time()
        try:
            self._call_all(action, calls, result)
        finally:
            self.gate.release(grant)
        timings.stored = time.time()
        return result

    def _call_all(self, action: Action, calls: Sequence[ApiCall], result: ActionResult) -> None:
        timings = result.timings
        deadline = time.monotonic() + (action.timeout_s or self.settings.default_timeout_s)
        responses: list[dict[str, Any]] = []
        timings.exec_started = time.time()
        start = time.perf_counter()
        result.status = "ok"
        for call in calls:
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError("no time left for this call")
                reply = http_call(call_url(self.specs[call.api], call), call.method, call.body,
                                  call.headers, left, self.settings.output_cap_bytes)
            except TimeoutError as exc:
                result.status, result.error = "timeout", f"{call.api} {call.path}: {exc}"
                break
            except (OSError, ValidationError) as exc:
                result.status, result.error = "failed", f"{call.api} {call.path}: {exc}"
                break
            responses.append(reply_output(call, reply))
            if not 200 <= reply.status < 300:
                result.status = "failed"
                result.error = f"{call.api} {call.method} {call.path}: HTTP {reply.status}"
                break
        timings.exec_s = time.perf_counter() - start
        timings.exec_finished = time.time()
        result.output = {"responses": responses,
                         "status_code": responses[-1]["status_code"] if responses else None}


# --------------------------------------------------------------------------- the worker


def default_window(spec: ApiSpec) -> int:
    """Messages an API worker holds at once: twice the API's concurrency (at least +4), or 16
    for an API limited by quota only; never more than about a minute of its quota, so a held
    (unacked) message never waits anywhere near the broker's visibility timeout. Waiters beyond
    what the API allows queue in the gate, in the basic manager's order; the rest stay in the
    broker's queue (FIFO)."""
    window = 16 if spec.concurrency is None else max(2 * spec.concurrency, spec.concurrency + 4)
    if spec.quota is not None:
        window = min(window, spec.quota.capacity + math.ceil(spec.quota.rate_per_s * 60))
    return max(window, 1)


def worker_name(api: str, pid: int | None = None, host: str | None = None) -> str:
    """Celery node name of the API worker running in process ``pid``."""
    return f"api-{api}-{pid or os.getpid()}@{host or socket.gethostname()}"


def build_api_pool(settings: Settings, api: str) -> ApiPool:
    """An API pool runtime for ``api`` over the settings' Redis."""
    specs = parse_api_limits(settings.api_limits)
    store = QuotaStore(redis.Redis.from_url(settings.redis_url), specs, settings.api_bypass_s)
    return ApiPool(settings, api, ApiGate(store), worker_name(api))


def run_api_worker(settings: Settings, api: str, concurrency: int | None = None,
                   loglevel: str = "INFO") -> None:
    """Run an API pool worker for ``api`` in this process until it is told to stop."""
    pool = build_api_pool(settings, api)
    window = concurrency or settings.admission_window or default_window(pool.spec)
    serve(settings, pool, keys.api_queue(api), f"api-{api}-{os.getpid()}@%h", window, loglevel,
          f"API pool {api} ready: window {window}, limits {pool.spec}")


def spawn_api_worker(env: Mapping[str, str], api: str, concurrency: int | None = None,
                     log_path: Path | None = None) -> subprocess.Popen[bytes]:
    """Start an API worker subprocess with the given ``TANGRAM_`` environment."""
    argv = [sys.executable, "-m", "tangram_celery.pools.api_pool", "--api", api]
    if concurrency:
        argv += ["--concurrency", str(concurrency)]
    output = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    try:
        return subprocess.Popen(argv, env={**os.environ, **env}, stdout=output,
                                stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        if log_path:
            output.close()  # type: ignore[union-attr]


def wait_for_worker(app: Celery, name: str, process: subprocess.Popen[bytes] | None = None,
                    timeout: float = 30.0) -> None:
    """Block until the Celery worker ``name`` answers a ping (it then consumes its queue)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise ServiceError(f"worker {name} exited with {process.returncode}; see its log")
        if app.control.ping(destination=[name], timeout=0.3, limit=1):
            return
    raise ServiceError(f"worker {name} did not answer within {timeout} s; see its log")


def api_action(trajectory_id: str, api: str, path: str, *, method: str = "GET",
               params: Mapping[str, Any] | None = None, json_body: Any = None,
               amount: int = 1, **fields: Any) -> Action:
    """An ``api`` action: one call of ``api`` at ``path``, costing ``amount`` of its limits."""
    call: dict[str, Any] = {"api": api, "method": method, "path": path}
    if params:
        call["params"] = dict(params)
    if json_body is not None:
        call["json"] = json_body
    cost = {f"api:{api}": amount, **fields.pop("cost", {})}
    apis = frozenset(name[4:] for name in cost if name.startswith("api:"))
    body = {"kind": "api", "trajectory_id": trajectory_id, "payload": call, "cost": cost,
            **fields}
    return parse_action(body, ActionLimits(apis=apis))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tangram_celery.pools.api_pool --api NAME [--concurrency N] [--loglevel L]``."""
    parser = argparse.ArgumentParser(prog="python -m tangram_celery.pools.api_pool",
                                     description="run an API pool worker")
    parser.add_argument("--api", required=True, help="API name; its queue is tangram.api.NAME")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="messages held at once (default: 2x the API's concurrency, min +4)")
    parser.add_argument("--loglevel", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    try:
        run_api_worker(Settings.from_env(), args.api, args.concurrency, args.loglevel)
    except TangramError as exc:
        print(f"tangram: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
