"""The docker backend's exec protocol: the in-container wrapper and file receiver, and their wire.

The exec's stdin carries the spec's files (:func:`encode_files`) and then the command's stdin;
its output comes back as Docker's multiplexed frames (:class:`FrameDemuxer`). On stderr the
wrapper prints a ready marker when the command starts and a trailer when it ends
(:class:`Trailer`); before the start it may report a broken container or a file error instead
(:func:`preamble_error`). Pure: no socket, no engine.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from tangram_celery.errors import SandboxError, SandboxSpecError, WorkdirQuotaError
from tangram_celery.sandbox.base import UNITS_ENV, ExecSpec
from tangram_celery.sandbox.output import Sink
from tangram_celery.sandbox.validation import SpecFile

MIN_FREE_PIDS = 4
READY_MARKER = b"\x1etangram-ready\x1e"
_TRAILER_RE = re.compile(
    rb"\x1etangram-end (-?\d+) (\d+) (\d+) (-?\d+) ?(?:(\d+) (\d+) (\d+))?\x1e\Z"
)
_BROKEN_RE = re.compile(rb"\x1etangram-broken ([^\x1e]*)\x1e")
_FILES_ERROR_RE = re.compile(rb"\x1etangram-files-error ([^\x1e]*)\x1e")
TRAILER_HOLD = 128

# The in-container wrapper: $1 timeout, $2 command, $3 "1" when a file stream precedes stdin,
# $4 the minimum of free pids, $5 the file receiver. fd 3 is the action's stderr; the wrapper's
# own noise goes nowhere. `room N` kills what earlier actions left (`kill -9 -1` spares this
# shell) and waits, without forking, until N pids are free. The ready marker is printed by the
# forked child, so a fork that fails (pid cap) counts as "did not start".
WRAPPER = r"""exec 3>&2 2>/dev/null
pids() { c=; m=; for d in /sys/fs/cgroup/pids /sys/fs/cgroup; do
  if [ -r "$d/pids.current" ]; then read -r c < "$d/pids.current"; read -r m < "$d/pids.max"
  return; fi; done; }
spin() { read -r a _ < /proc/uptime; a=${a%.*}${a#*.}; b=$a
  while [ "$b" -le "$a" ]; do read -r b _ < /proc/uptime; b=${b%.*}${b#*.}; done; }
room() { n=0; kill -9 -1; pids
  while [ -n "$m" ] && [ "$m" != max ] && [ $((m - c)) -lt "$1" ]; do
    n=$((n + 1)); [ "$n" -gt 200 ] && return 1; spin; kill -9 -1; pids; done; }
oom() { o=0; for f in /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events; do
  [ -r "$f" ] || continue; while read -r k v; do [ "$k" = oom_kill ] && o=$v; done < "$f"
  return; done; }
if ! room "$4"; then
  printf '\036tangram-broken pid cap exhausted: %s of %s in use\036' "$c" "$m" >&3; exit 125
fi
oom; o0=$o
if [ "$3" = 1 ]; then python3 -I -S -c "$5" 2>&3 || exit 125; fi
read -r u0 _ < /proc/uptime
( exec 2>&3 3>&-; printf '\036tangram-ready\036' >&2; exec timeout -s KILL "$1" /bin/sh -c "$2" )
rc=$?
read -r u1 _ < /proc/uptime
oom; s=
if room 2; then s=$(stat -f -c '%b %f %S' /work) || s=; fi
printf '\036tangram-end %s %s %s %s %s\036' "$rc" "$o0" "$o" \
  $(( (${u1%.*} - ${u0%.*}) * 100 + 1${u1#*.} - 1${u0#*.} )) "$s" >&3
exit $rc
"""

# Writes the spec's files under /work from stdin (10-digit header length, JSON header of
# [path parts, size], then the contents), never through a symlink, exactly like
# :func:`tangram_celery.sandbox.workdir.write_files`. Reads no byte past the files.
RECEIVER = r"""
import json, os, stat
F = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
def fail(kind, where, reason):
    msg = json.dumps([kind, where, reason]).encode()
    os.write(2, b"\x1etangram-files-error " + msg + b"\x1e")
    os._exit(125)
def rd(n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(0, min(n - len(buf), 1 << 20))
        if not chunk:
            fail("spec", "files", "the file stream ended early")
        buf += chunk
    return bytes(buf)
def opendir(parent, name, where):
    try:
        return os.open(name, F, dir_fd=parent)
    except FileNotFoundError:
        pass
    except OSError as exc:
        fail("spec", where, "%r exists in the work dir and is not a directory (%s); "
             "pick another path" % (name, exc.strerror))
    try:
        os.mkdir(name, 0o755, dir_fd=parent)
    except FileExistsError:
        pass
    return os.open(name, F, dir_fd=parent)
def write(parent, name, size, where):
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            fail("spec", where, "%r is a directory in the work dir; pick another path" % name)
        os.unlink(name, dir_fd=parent)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, 0o644, dir_fd=parent)
    left = size
    while left:
        view = memoryview(rd(min(left, 1 << 20)))
        left -= len(view)
        while view:
            view = view[os.write(fd, view):]
    os.close(fd)
header = json.loads(rd(int(rd(10))))
root = os.open("/work", F)
for parts, size in header:
    where = "files[%r]" % "/".join(parts)
    d = root
    try:
        for part in parts[:-1]:
            d = opendir(d, part, where)
        write(d, parts[-1], size, where)
    except OSError as exc:
        kind = "quota" if exc.errno in (28, 122) else "spec"
        fail(kind, where, "cannot write it: %s" % exc.strerror)
"""


def encode_files(files: Sequence[SpecFile]) -> bytes:
    """The receiver's input: a 10-digit header length, the JSON header, then the contents."""
    header = json.dumps([[list(f.parts), len(f.data)] for f in files]).encode()
    return f"{len(header):010d}".encode() + header + b"".join(f.data for f in files)


def stdin_payload(spec: ExecSpec, files: list[SpecFile]) -> bytes | None:
    """The exec's stdin: the encoded files (if any), then the spec's stdin; None when neither."""
    data = encode_files(files) if files else b""
    if spec.stdin is not None:
        data += spec.stdin.encode("utf-8", "surrogateescape")
    return data if (files or spec.stdin is not None) else None


def wrapper_argv(timeout_s: float, command: str, has_files: bool) -> list[str]:
    """The exec's argv: the wrapper with its positional parameters."""
    return ["/bin/sh", "-c", WRAPPER, "tangram", f"{timeout_s:.3f}", command,
            "1" if has_files else "0", str(MIN_FREE_PIDS), RECEIVER]


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


@dataclass(frozen=True)
class Trailer:
    """What the wrapper reported after the command: status, OOM kills, time, work-dir use."""

    exit_code: int
    oom_before: int
    oom_after: int
    elapsed_s: float
    workdir_bytes: int | None

    @property
    def oom_killed(self) -> bool:
        """Whether the kernel OOM-killed a process of the container during the command."""
        return self.oom_after > self.oom_before


def parse_trailer(data: bytes) -> tuple[bytes, Trailer | None]:
    """Split a stream's tail into (the command's bytes, the wrapper's trailer or None)."""
    match = _TRAILER_RE.search(data)
    if match is None:
        return data, None
    rc, before, after, centis, blocks, free, bsize = match.groups()
    used = None
    if blocks is not None and free is not None and bsize is not None:
        used = max(int(blocks) - int(free), 0) * int(bsize)
    trailer = Trailer(int(rc), int(before), int(after), int(centis) / 100.0, used)
    return data[: match.start()], trailer


@dataclass
class TrailerSink:
    """Holds back the last bytes of stderr until the end, where the wrapper's trailer sits."""

    inner: Sink
    hold: int = TRAILER_HOLD
    tail: bytearray = field(default_factory=bytearray)
    trailer: Trailer | None = None

    def feed(self, chunk: bytes, now: float) -> None:
        """Pass on everything but the last ``hold`` bytes."""
        self.tail += chunk
        if len(self.tail) > self.hold:
            cut = len(self.tail) - self.hold
            self.inner.feed(bytes(self.tail[:cut]), now)
            del self.tail[:cut]

    def finish(self, now: float) -> Trailer | None:
        """At end of stream: strip and parse the trailer, pass on the rest."""
        rest, self.trailer = parse_trailer(bytes(self.tail))
        self.tail.clear()
        if rest:
            self.inner.feed(rest, now)
        return self.trailer


class Broken(SandboxError):
    """The container cannot run actions any more; replace it."""


def preamble_error(preamble: bytes) -> SandboxError | None:
    """The error the wrapper reported before the command started, if any."""
    match = _FILES_ERROR_RE.search(preamble)
    if match is not None:
        try:
            kind, where, reason = json.loads(match.group(1).decode("utf-8", "replace"))
        except (ValueError, TypeError):
            kind, where, reason = "spec", "files", "the file receiver failed"
        if kind == "quota":
            return WorkdirQuotaError(f"{where}: {reason}; the work dir is full, "
                                     "end_trajectory() it and start over")
        return SandboxSpecError(str(where), str(reason))
    match = _BROKEN_RE.search(preamble)
    if match is not None:
        return Broken(match.group(1).decode("utf-8", "replace"))
    return None


def exit_status(code: int | None, *, timed_out: bool) -> tuple[int | None, int | None]:
    """(exit_code, signal) in the shell convention (``128 + n`` means signal ``n``)."""
    if timed_out:
        return None, 9
    if code is None or code < 0:
        return None, None
    if 128 < code <= 128 + 64:
        return code, code - 128
    return code, None


def command_start(t0: float, marker_at: float | None, end: float, trailer: Trailer | None) -> float:
    """When the command started, on the host clock, for the setup/exec split of an outcome.

    The host stamps the ready marker when it reads it, which a loaded engine can deliver late;
    the wrapper's own clock says the command ran ``trailer.elapsed_s`` and ended before
    ``end``, so the start is no later than ``end - elapsed_s``.
    """
    start = end if marker_at is None else marker_at
    if trailer is not None:
        start = min(start, end - trailer.elapsed_s)
    return min(max(start, t0), end)
