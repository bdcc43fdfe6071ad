"""The gateway's request log: a request line keeps its path, never the token of its query."""

from __future__ import annotations

import logging
import threading
import urllib.error
import urllib.request
from typing import Any, cast

import pytest

from tangram_celery.gateway.server import GatewayHTTPServer


def get(url: str) -> int:
    """The status of a GET."""
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_the_gateways_request_log_masks_the_token(caplog: pytest.LogCaptureFixture) -> None:
    token = "gw-token-in-a-query-0123"  # nosec B105 # the test's own gateway token
    caplog.set_level(logging.DEBUG, logger="tangram_celery.gateway.server")
    server = GatewayHTTPServer(("127.0.0.1", 0), cast(Any, None), token)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert get(f"{server.url}/v1/ping?token={token}") == 200
        assert get(f"{server.url}/run_code?token={token}") == 404
    finally:
        server.shutdown()
        server.server_close()
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "/v1/ping?token=*** HTTP/1.1" in logged
    assert token not in logged
