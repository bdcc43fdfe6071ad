"""The gateway as a local process: start ``python -m tangram_celery.gateway`` and wait for it.

Used by the tests and ``tangram bench gateway`` (``tangram up`` starts it from the compose file).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from tangram_celery.errors import ServiceError
from tangram_celery.gateway.command import ping
from tangram_celery.processes import spawn_process

LOOPBACK = "127.0.0.1"


def spawn_gateway(env: Mapping[str, str], port: int, log_path: Path | None = None,
                  address: str = LOOPBACK) -> subprocess.Popen[bytes]:
    """Start ``tangram gateway`` on ``address:port`` with the given ``TANGRAM_`` environment."""
    argv = [sys.executable, "-m", "tangram_celery.gateway", "--address", address,
            "--port", str(port)]
    return spawn_process(argv, env, log_path)


def wait_for_gateway(port: int, process: subprocess.Popen[bytes] | None = None,
                     timeout: float = 30.0, address: str = LOOPBACK) -> str:
    """Block until the gateway answers ``/v1/ping``; its URL. Raises :class:`ServiceError`
    when ``process`` exits first or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise ServiceError(f"tangram gateway exited with {process.returncode}; see its log")
        if ping(address, port, timeout=1.0):
            return f"http://{address}:{port}"
        time.sleep(0.05)
    raise ServiceError(f"tangram gateway on port {port} did not answer within {timeout} s")
