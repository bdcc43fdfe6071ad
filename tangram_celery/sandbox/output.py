"""Output sinks and pumping: capped buffers, the ready marker, a child's pipes under a deadline.

A backend feeds a child's stdin and drains its stdout and stderr into sinks, keeping at most the
output cap of each and reading past it, so a chatty command never blocks on a full pipe.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol


class Sink(Protocol):
    """Receives a stream's bytes as they arrive."""

    def feed(self, chunk: bytes, now: float) -> None:
        """Take one chunk read at time ``now``."""
        ...


@dataclass
class CappedBuffer:
    """Keeps the first ``cap`` bytes of a stream and counts the rest."""

    cap: int
    data: bytearray = field(default_factory=bytearray)
    total: int = 0

    def feed(self, chunk: bytes, now: float) -> None:
        """Keep what fits under the cap, count everything."""
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        self.total += len(chunk)

    @property
    def truncated(self) -> bool:
        """Whether bytes were dropped."""
        return self.total > self.cap

    def text(self) -> str:
        """The kept bytes, decoded as UTF-8 with replacement characters."""
        return self.data.decode("utf-8", errors="replace")


@dataclass
class ReadyMarker:
    """Strips a start marker from the head of a stream and records when it arrived.

    A backend makes its in-sandbox wrapper print ``marker`` just before it execs the user's
    command: bytes before the marker are setup noise (kept in ``preamble`` for error messages),
    bytes after it go to ``inner``.
    """

    marker: bytes
    inner: Sink
    preamble: bytearray = field(default_factory=bytearray)
    ready_at: float | None = None
    max_preamble: int = 65536

    def feed(self, chunk: bytes, now: float) -> None:
        """Look for the marker until found, then forward everything."""
        if self.ready_at is not None:
            self.inner.feed(chunk, now)
            return
        self.preamble += chunk
        idx = self.preamble.find(self.marker)
        if idx >= 0:
            self.ready_at = now
            rest = bytes(self.preamble[idx + len(self.marker):])
            del self.preamble[idx:]
            if rest:
                self.inner.feed(rest, now)
        elif len(self.preamble) > self.max_preamble:
            del self.preamble[: len(self.preamble) - self.max_preamble]


def pump(
    proc: subprocess.Popen[bytes],
    sinks: Mapping[int, Sink],
    stdin_data: bytes | None,
    deadline: float,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Feed ``proc``'s stdin and drain its stdout/stderr into ``sinks`` until EOF or ``deadline``.

    ``sinks`` maps 1 (stdout) and 2 (stderr) to sinks. Reading continues past any cap so a chatty
    command never blocks on a full pipe. Returns True when both streams reached EOF in time.
    """
    streams = {1: proc.stdout, 2: proc.stderr}
    with selectors.DefaultSelector() as sel:
        for index, stream in streams.items():
            if stream is not None:
                sel.register(stream.fileno(), selectors.EVENT_READ, index)
        pending = memoryview(stdin_data) if stdin_data else None
        if proc.stdin is not None:
            if pending is None:
                proc.stdin.close()
            else:
                os.set_blocking(proc.stdin.fileno(), False)
                sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE, 0)
        readers = sum(1 for s in streams.values() if s is not None)
        while readers:
            remaining = deadline - clock()
            if remaining <= 0:
                return False
            for key, _ in sel.select(min(remaining, 1.0)):
                if key.data == 0:
                    pending = _write_some(proc, sel, pending)
                    continue
                chunk = os.read(key.fd, 65536)
                if chunk:
                    sinks[key.data].feed(chunk, clock())
                else:
                    sel.unregister(key.fd)
                    readers -= 1
        if proc.stdin is not None and not proc.stdin.closed:
            sel.unregister(proc.stdin.fileno())
            proc.stdin.close()
    return True


def _write_some(
    proc: subprocess.Popen[bytes], sel: selectors.BaseSelector, pending: memoryview | None
) -> memoryview | None:
    """Write what the stdin pipe takes now; close it when done or when the reader went away."""
    assert proc.stdin is not None
    try:
        written = os.write(proc.stdin.fileno(), pending) if pending else 0
    except BlockingIOError:
        return pending
    except (BrokenPipeError, OSError):
        written = len(pending) if pending else 0
    rest = pending[written:] if pending else None
    if not rest:
        sel.unregister(proc.stdin.fileno())
        proc.stdin.close()
        return None
    return rest
