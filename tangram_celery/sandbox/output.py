"""Output sinks and pumping: capped buffers, the ready marker, a child's pipes under a deadline.

A backend feeds a child's stdin and drains its stdout and stderr into sinks, keeping at most the
output cap of each (its head and its tail, where test summaries and final answers are) and reading
past it, so a chatty command never blocks on a full pipe.
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


CUT_MARKER = "\n[... tangram: {cut} bytes cut ...]\n"
"""What stands between the kept head and tail of a stream over its cap."""


@dataclass
class CappedBuffer:
    """Keeps the first and the last bytes of a stream, ``cap`` in all, and counts the rest.

    The head takes ``cap // 2`` bytes, a ring buffer of ``cap - cap // 2`` keeps the tail, so
    memory stays bounded however much is fed. :meth:`text` joins them with :data:`CUT_MARKER`
    naming how many bytes were cut, and cuts only between UTF-8 characters.
    """

    cap: int
    head: bytearray = field(default_factory=bytearray)
    total: int = 0
    _ring: bytearray = field(default_factory=bytearray, init=False, repr=False)
    _end: int = field(default=0, init=False, repr=False)
    """Where the next tail byte goes in ``_ring`` once it is full."""

    def feed(self, chunk: bytes, now: float) -> None:
        """Keep what fits in the head, pass the rest through the tail ring, count everything."""
        self.total += len(chunk)
        room = self.cap // 2 - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self._keep_tail(chunk)

    def _keep_tail(self, chunk: bytes) -> None:
        size = self.cap - self.cap // 2
        if size <= 0:
            return
        if len(chunk) >= size:
            self._ring[:] = chunk[-size:]
            self._end = 0
            return
        free = size - len(self._ring)
        if free > 0:
            self._ring += chunk[:free]
            chunk = chunk[free:]
        while chunk:
            step = min(len(chunk), size - self._end)
            self._ring[self._end:self._end + step] = chunk[:step]
            self._end = (self._end + step) % size
            chunk = chunk[step:]

    @property
    def tail(self) -> bytes:
        """The kept tail, oldest byte first."""
        return bytes(self._ring[self._end:] + self._ring[:self._end])

    @property
    def data(self) -> bytes:
        """Every kept byte (head then tail, without the marker)."""
        return bytes(self.head) + self.tail

    @property
    def truncated(self) -> bool:
        """Whether bytes were dropped."""
        return self.total > self.cap

    @property
    def cut(self) -> int:
        """How many bytes :meth:`text` leaves out (0 when nothing was dropped)."""
        if not self.truncated:
            return 0
        head, tail = self._clean_ends()
        return self.total - len(head) - len(tail)

    def text(self) -> str:
        """The kept bytes decoded as UTF-8 with replacement characters; over the cap, the head
        and the tail with the marker of the bytes cut between them."""
        if not self.truncated:
            return self.data.decode("utf-8", errors="replace")
        head, tail = self._clean_ends()
        cut = self.total - len(head) - len(tail)
        return (head.decode("utf-8", errors="replace") + CUT_MARKER.format(cut=cut)
                + tail.decode("utf-8", errors="replace"))

    def _clean_ends(self) -> tuple[bytes, bytes]:
        """Head and tail trimmed so neither splits a UTF-8 character at the cut."""
        return _drop_partial_end(bytes(self.head)), _drop_partial_start(self.tail)


def _drop_partial_end(data: bytes) -> bytes:
    """``data`` without a multi-byte UTF-8 character left incomplete at its end."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return data
        if byte >= 0xC0:
            length = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return data if back >= length else data[:-back]
    return data


def _drop_partial_start(data: bytes) -> bytes:
    """``data`` without the continuation bytes of a character whose start was cut off."""
    skip = 0
    while skip < min(3, len(data)) and 0x80 <= data[skip] < 0xC0:
        skip += 1
    return data[skip:]


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
