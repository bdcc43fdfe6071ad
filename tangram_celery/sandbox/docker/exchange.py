"""The exec's socket exchange: stdin sent, output demultiplexed into sinks, all under a deadline.

``exec_start(socket=True)`` hands back the engine's upgraded HTTP connection; :func:`raw_socket`
and :func:`read_ahead` get at its socket and at the bytes the HTTP reader already took from it.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tangram_celery.errors import SandboxSetupError
from tangram_celery.sandbox.docker.protocol import FrameDemuxer
from tangram_celery.sandbox.output import Sink


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


@dataclass
class Exchange:
    """The exec's socket traffic: what to send, where the output goes, when to give up."""

    sock: socket.socket
    demux: FrameDemuxer
    sinks: Mapping[int, Sink]
    payload: bytes | None
    deadline: Callable[[], float]


def pump_socket(ex: Exchange, first: bytes, clock: Callable[[], float] = time.monotonic) -> bool:
    """Send ``ex.payload`` (then half-close) while reading frames into the sinks until EOF.

    Returns False when the deadline passed first. Never blocks past the deadline.
    """
    _deliver(ex, first, clock)
    ex.sock.setblocking(False)
    view = memoryview(ex.payload) if ex.payload is not None else None
    with selectors.DefaultSelector() as sel:
        sel.register(ex.sock, _events(view))
        if view is not None and not view:
            _half_close(ex.sock, sel)
            view = None
        while True:
            remaining = ex.deadline() - clock()
            if remaining <= 0:
                return False
            for _key, mask in sel.select(min(remaining, 0.5)):
                if mask & selectors.EVENT_WRITE and view is not None:
                    view = _send_some(ex.sock, sel, view)
                if mask & selectors.EVENT_READ and not _receive(ex, clock):
                    return True


def _events(view: memoryview | None) -> int:
    return selectors.EVENT_READ | (selectors.EVENT_WRITE if view is not None else 0)


def _half_close(sock: socket.socket, sel: selectors.BaseSelector) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
    sel.modify(sock, selectors.EVENT_READ)


def _send_some(
    sock: socket.socket, sel: selectors.BaseSelector, view: memoryview
) -> memoryview | None:
    try:
        sent = sock.send(view[: 1 << 20])
    except BlockingIOError:
        return view
    except OSError:  # the process stopped reading (exited): drop the rest of stdin
        sent = len(view)
    rest = view[sent:]
    if rest:
        return rest
    _half_close(sock, sel)
    return None


def _receive(ex: Exchange, clock: Callable[[], float]) -> bool:
    """Read once; False at end of stream."""
    try:
        data = ex.sock.recv(1 << 16)
    except BlockingIOError:
        return True
    except OSError:
        return False
    if not data:
        return False
    _deliver(ex, data, clock)
    return True


def _deliver(ex: Exchange, data: bytes, clock: Callable[[], float]) -> None:
    for stream, piece in ex.demux.feed(data):
        sink = ex.sinks.get(stream)
        if sink is not None:
            sink.feed(piece, clock())
