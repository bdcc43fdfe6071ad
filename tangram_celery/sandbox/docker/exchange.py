"""The exec's socket: ``exec_start(socket=True)`` hands back the engine's upgraded HTTP
connection; :func:`raw_socket` and :func:`read_ahead` get at its socket and at the bytes the
HTTP reader already took from it.
"""

from __future__ import annotations

import socket
from typing import Any

from tangram_celery.errors import SandboxSetupError


def raw_socket(handle: Any) -> socket.socket:
    """The plain socket under what ``exec_start(socket=True)`` returns."""
    if isinstance(handle, socket.socket):
        return handle
    inner = getattr(handle, "_sock", None)
    if isinstance(inner, socket.socket):
        return inner
    raise SandboxSetupError(f"unsupported Docker exec socket {type(handle).__name__}; "
                            "use a unix:// or tcp:// engine URL")


def read_ahead(handle: Any) -> bytes:
    """Stream bytes the HTTP reader may have buffered past the upgrade response headers."""
    response = getattr(handle, "_response", None)
    reader = getattr(getattr(getattr(response, "raw", None), "_fp", None), "fp", None)
    if reader is None or not hasattr(reader, "peek"):
        return b""
    try:
        buffered = reader.peek(0)
    except (OSError, ValueError):
        return b""
    if not buffered:
        return b""
    return bytes(reader.read(len(buffered)))
