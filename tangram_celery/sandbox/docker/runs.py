"""Reaching a malleable test run inside a container: its control socket is in the container's
tmpfs work dir, which the node cannot open, so each request is one ``docker exec`` of a small
stdlib client, as the container's sandbox uid (the run's own), with ``python3 -I`` (no path
from the work dir, which the action controls)."""

from __future__ import annotations

import json
from typing import Any

from tangram_celery.sandbox.docker.engine import API_ERRORS

CLIENT = (
    "import socket, sys\n"
    "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
    "s.settimeout(float(sys.argv[3]))\n"
    "s.connect(sys.argv[1])\n"
    "s.sendall(b'{\"op\": \"' + sys.argv[2].encode() + b'\"}\\n')\n"
    "answer = b''\n"
    "while not answer.endswith(b'\\n'):\n"
    "    chunk = s.recv(65536)\n"
    "    if not chunk:\n"
    "        sys.exit(3)\n"
    "    answer += chunk\n"
    "sys.stdout.write(answer.decode())\n"
)
"""The client run in the container: one request, its one-line answer on stdout."""

OPERATIONS = ("grow", "shrink", "status")


def exec_control(container: Any, uid: int, socket_path: str, operation: str,
                 timeout: float) -> dict[str, Any]:
    """Send ``operation`` to the run listening at ``socket_path`` in ``container``; its answer.
    Raises ``OSError`` when the run does not answer (no socket yet, the run ended, the engine
    failed) and ``ValueError`` when the answer is not one JSON object."""
    if operation not in OPERATIONS:
        raise ValueError(f"unknown operation {operation!r}; choose one of {list(OPERATIONS)}")
    try:
        code, out = container.exec_run(
            ["python3", "-I", "-c", CLIENT, socket_path, operation, str(timeout)],
            user=str(uid), stdout=True, stderr=False)
    except API_ERRORS as exc:
        raise OSError(f"cannot reach the malleable run in container {container.id[:12]}: "
                      f"{exc}") from exc
    if code != 0:
        raise OSError(f"the malleable run in container {container.id[:12]} did not answer "
                      f"{operation!r} (exit {code})")
    answer = json.loads(out.decode("utf-8", "replace"))
    if not isinstance(answer, dict):
        raise ValueError(f"a malleable run answered {operation!r} with {answer!r}")
    return answer
