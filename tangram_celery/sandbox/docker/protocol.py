"""The docker backend's pure helpers: Docker's exec frames, unit counts and exit statuses.

Docker multiplexes an exec's output into frames (:class:`FrameDemuxer`); the container's
resident executor (:mod:`tangram_celery.sandbox.docker.resident`) speaks inside that stream.
Pure: no socket, no engine.
"""

from __future__ import annotations

from tangram_celery.errors import SandboxError
from tangram_celery.sandbox.base import UNITS_ENV, ExecSpec

MIN_FREE_PIDS = 4
"""Free pids an action needs at its start (its shell and a few processes)."""


def units_of(spec: ExecSpec) -> int:
    """The unit count of a spec: its ``TANGRAM_UNITS`` if set, else one per listed core."""
    explicit = spec.env.get(UNITS_ENV)
    return int(explicit) if explicit else len(spec.cores)


class FrameDemuxer:
    """Splits Docker's multiplexed exec stream into (stream, bytes) pieces.

    Each frame has an 8-byte header: the stream (1 stdout, 2 stderr, 3 engine error), three
    zero bytes and the big-endian payload size. Bytes that do not parse as a header (an engine
    error printed raw) are passed on as stream 3, as is everything after them.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._stream = 0
        self._left = 0
        self.raw = False

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Take bytes read from the socket; return the payload pieces they complete."""
        self._buf += data
        out: list[tuple[int, bytes]] = []
        while self._buf:
            if self.raw:
                out.append((3, bytes(self._buf)))
                self._buf.clear()
            elif self._left:
                piece = bytes(self._buf[: self._left])
                del self._buf[: len(piece)]
                self._left -= len(piece)
                out.append((self._stream, piece))
            elif len(self._buf) < 8:
                break
            elif self._buf[0] > 3 or self._buf[1:4] != b"\0\0\0":
                self.raw = True
            else:
                self._stream = self._buf[0]
                self._left = int.from_bytes(self._buf[4:8], "big")
                del self._buf[:8]
        return out

    def pending(self) -> bytes:
        """Bytes of an incomplete header left at the end of the stream."""
        return bytes(self._buf)


class Broken(SandboxError):
    """The container cannot run actions any more; replace it."""


def exit_status(code: int | None, *, timed_out: bool) -> tuple[int | None, int | None]:
    """(exit_code, signal) in the shell convention (``128 + n`` means signal ``n``)."""
    if timed_out:
        return None, 9
    if code is None or code < 0:
        return None, None
    if 128 < code <= 128 + 64:
        return code, code - 128
    return code, None


def command_start(
    t0: float, started_at: float | None, end: float, elapsed_s: float | None
) -> float:
    """When the command started, on the host clock, for the setup/exec split of an outcome.

    The host stamps the start when it reads the executor's frame, which a loaded host can
    deliver late; the executor's own clock says the command ran ``elapsed_s`` and ended before
    ``end``, so the start is no later than ``end - elapsed_s``.
    """
    start = end if started_at is None else started_at
    if elapsed_s is not None:
        start = min(start, end - elapsed_s)
    return min(max(start, t0), end)
