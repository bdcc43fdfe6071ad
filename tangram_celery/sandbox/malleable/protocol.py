"""The runner's wire format: one JSON object per line over a Unix stream socket, never pickle.

A worker opens with ``{"op": "hello", "role": "worker", "pid": ...}``, a controlling process
(the node) with ``{"op": "grow" | "shrink" | "status"}``. :class:`Channel` frames the lines.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any

Message = dict[str, Any]
"""One decoded line."""

MAX_LINE = 64 * 1024 * 1024
"""The longest line a channel accepts (a report with a long traceback is well under it)."""


def encode(message: Message) -> bytes:
    """``message`` as one JSON line; values JSON cannot hold are written as their ``repr``."""
    return json.dumps(message, default=repr, separators=(",", ":")).encode() + b"\n"


class Channel:
    """Line-framed JSON over one connected socket: blocking :meth:`request` for a worker or a
    control client, non-blocking :meth:`feed` for the controller's event loop."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = bytearray()

    def send(self, message: Message) -> None:
        """Write one message (blocking until the kernel took all of it)."""
        self.sock.sendall(encode(message))

    def receive(self) -> Message | None:
        """Block until one whole message arrived; None when the peer closed the connection."""
        while True:
            found = self._pop()
            if found is not None:
                return found
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self._buffer += chunk

    def request(self, message: Message) -> Message:
        """Send ``message`` and wait for its answer."""
        self.send(message)
        answer = self.receive()
        if answer is None:
            raise ConnectionError("the malleable test run's controller went away")
        return answer

    def feed(self) -> tuple[list[Message], bool]:
        """Read what is there now: the whole messages it completes, and whether the peer closed."""
        chunk = self.sock.recv(65536)
        self._buffer += chunk
        messages = []
        while (found := self._pop()) is not None:
            messages.append(found)
        return messages, not chunk

    def _pop(self) -> Message | None:
        end = self._buffer.find(b"\n")
        if end < 0:
            if len(self._buffer) > MAX_LINE:
                raise ValueError("a malleable runner message is over its size limit")
            return None
        line = bytes(self._buffer[:end])
        del self._buffer[:end + 1]
        decoded = json.loads(line)
        if not isinstance(decoded, dict):
            raise ValueError(f"a malleable runner message is not an object: {line[:80]!r}")
        return decoded

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()


SOCKET_PATH_MAX = 100
"""Beyond this many bytes a socket path is reached through its directory's descriptor (a Unix
socket address holds 107; a work dir on the node is often deeper)."""


def connect(path: str, timeout: float | None = None) -> Channel:
    """A channel to the controller listening at the Unix socket ``path`` (of any length)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        if len(os.fsencode(path)) <= SOCKET_PATH_MAX:
            sock.connect(path)
        else:
            directory = os.open(os.path.dirname(path) or ".", os.O_PATH | os.O_DIRECTORY)
            try:
                sock.connect(f"/proc/self/fd/{directory}/{os.path.basename(path)}")
            finally:
                os.close(directory)
    except OSError:
        sock.close()
        raise
    return Channel(sock)
