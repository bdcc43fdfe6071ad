"""Local processes of tangram's own: a free loopback port, a child in its own session, a clean stop.

Used wherever tangram starts a process itself: the local stack, Flower, pool workers, the
tritonserver, the tests and the benchmarks.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host`` (the loopback interface by default)."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports that were free a moment ago on ``host`` (all bound at once,
    so the kernel cannot hand out one twice)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                 for _ in range(count)]
        for sock in socks:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def spawn_process(
    argv: Sequence[str], env: Mapping[str, str], log_path: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session with ``env`` over ours; output appended to
    ``log_path`` (discarded without one)."""
    output = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    try:
        return subprocess.Popen(list(argv), env={**os.environ, **env}, stdout=output,
                                stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        if log_path:
            output.close()  # type: ignore[union-attr]


def stop_process(process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM, wait, then SIGKILL; always reaps the process."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait(5)
