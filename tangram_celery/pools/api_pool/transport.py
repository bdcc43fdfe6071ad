"""The HTTP transport of an API pool: one request (no redirects followed), its reply's output."""

from __future__ import annotations

import contextlib
import http.client
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from tangram_celery.pools.api_pool.calls import ApiCall


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
