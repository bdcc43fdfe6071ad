"""The calls of an ``api`` action: their payload form, its validation, and the URL each reaches.

A call only ever reaches a path below its API's declared base URL (no SSRF): :func:`parse_calls`
refuses a host, scheme, query, fragment or ``.``/``..`` segment in a path, and :func:`call_url`
checks the URL it builds again. :func:`api_action` builds such an action.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlencode, urlsplit

from tangram_celery.action import Action, ActionLimits, parse_action
from tangram_celery.errors import ValidationError
from tangram_celery.managers.basic import ApiSpec

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
