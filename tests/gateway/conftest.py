"""A real stack for the gateway tests: the session's Redis, a real CPU node worker and
``python -m tangram_celery.gateway`` as a process of its own."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tangram_celery.gateway.launch import spawn_gateway, wait_for_gateway
from tangram_celery.processes import free_port, stop_process
from tangram_celery.settings import Settings

NODE = "gw-node"
StartGateway = Callable[..., str]


@pytest.fixture()
def gateway(settings: Settings, cpu_workers: Callable[..., list[str]],
            tmp_path: Path) -> Iterator[StartGateway]:
    """``gateway(token="", cores=2, **env) -> url``: a CPU node named ``gw-node`` and a gateway
    process in front of it, stopped after the test."""
    started: list[Any] = []
    log = tmp_path / "gateway.log"

    def start(token: str = "", cores: int = 2, **env: str) -> str:
        cpu_workers({NODE: cores})
        port = free_port()
        process = spawn_gateway({"TANGRAM_REDIS_URL": settings.broker.redis_url,
                                 "TANGRAM_GATEWAY_TOKEN": token,
                                 "TANGRAM_NODE_TTL_S": str(settings.node.ttl_s), **env},
                                port, log)
        started.append(process)
        return wait_for_gateway(port, process)

    yield start
    for process in started:
        stop_process(process)
    if log.exists() and "Traceback" in log.read_text(errors="replace"):
        print(f"--- gateway.log ---\n{log.read_text(errors='replace')[-4000:]}")


def call(url: str, method: str = "POST", body: Any = None, headers: dict[str, str] | None = None,
         raw: bytes | None = None, timeout: float = 120.0) -> tuple[int, Any]:
    """(HTTP status, decoded JSON or text) of one request to the gateway."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json",
                                              **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            status, text = reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        status, text = error.code, error.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def run_code(url: str, headers: dict[str, str] | None = None, **request: Any) -> dict[str, Any]:
    """POST ``/run_code``; fails the test unless the gateway answers 200."""
    status, body = call(f"{url}/run_code", body=request, headers=headers)
    assert status == 200, body
    assert isinstance(body, dict)
    return body
