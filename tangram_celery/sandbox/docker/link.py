"""The node's end of a container's resident executor: one long-lived exec stream, many actions.

:meth:`Resident.start` makes the one ``docker exec -i`` of the container's life (as its root,
see :mod:`tangram_celery.sandbox.docker.resident`) and keeps the exec's socket; no other
process holds it, and nothing inside the container can reach it but the resident.
:meth:`Resident.run` sends an action and reads its frames until it ends: no engine call.
"""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tangram_celery.errors import SandboxError, SandboxSpecError, WorkdirQuotaError
from tangram_celery.sandbox.docker import resident
from tangram_celery.sandbox.docker.engine import API_ERRORS
from tangram_celery.sandbox.docker.exchange import raw_socket, read_ahead
from tangram_celery.sandbox.docker.protocol import MIN_FREE_PIDS, Broken, FrameDemuxer
from tangram_celery.sandbox.output import CappedBuffer, Sink
from tangram_celery.sandbox.validation import SpecFile

SOURCE = Path(resident.__file__).read_text()
ROOT = "0:0"
PROBE_AFTER_S = 2.0
"""How long the resident may take to answer a request before the node asks the engine why."""


class ResidentLost(SandboxError):
    """The resident's stream ended (or broke) while an action ran."""


class Frames:
    """Splits the resident's stdout into (kind, payload) frames. Pure."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        """Take stream bytes; return the frames they complete."""
        self._buf += data
        out: list[tuple[bytes, bytes]] = []
        size = resident.FRAME.size
        while len(self._buf) >= size:
            kind, length = resident.FRAME.unpack(self._buf[:size])
            if len(self._buf) < size + length:
                break
            out.append((kind, bytes(self._buf[size:size + length])))
            del self._buf[:size + length]
        return out


@dataclass(frozen=True)
class Request:
    """One action for the resident."""

    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: str
    timeout_s: float
    files: Sequence[SpecFile]
    stdin: bytes | None

    def encode(self, action_id: int) -> bytes:
        """The request's bytes on the wire: length, JSON header, files, stdin."""
        header = json.dumps({
            "id": action_id, "argv": list(self.argv), "env": dict(self.env), "cwd": self.cwd,
            "timeout_s": self.timeout_s, "min_pids": MIN_FREE_PIDS,
            "files": [[list(f.parts), len(f.data)] for f in self.files],
            "stdin": None if self.stdin is None else len(self.stdin),
        }).encode()
        blob = b"".join(f.data for f in self.files) + (self.stdin or b"")
        return resident.REQUEST.pack(len(header)) + header + blob


@dataclass(frozen=True)
class End:
    """How the resident saw an action end."""

    status: int | None
    timed_out: bool
    elapsed_s: float
    oom_before: int
    oom_after: int
    workdir_bytes: int | None

    @property
    def exit_code(self) -> int | None:
        """The shell convention: the exit code, or ``128 + n`` for signal ``n``."""
        if self.status is None:
            return None
        if (self.status & 0x7F) == 0:
            return (self.status >> 8) & 0xFF
        return 128 + (self.status & 0x7F)


@dataclass
class Stamps:
    """When the action's command started (host clock); None until the resident says so."""

    started: float | None = None


def file_error(payload: bytes) -> SandboxError:
    """The error of an ``F`` frame: the spec's files could not be written."""
    try:
        kind, where, reason = json.loads(payload.decode("utf-8", "replace"))
    except (ValueError, TypeError):
        kind, where, reason = "spec", "files", "the file writer failed"
    if kind == "quota":
        return WorkdirQuotaError(f"{where}: {reason}; the work dir is full, "
                                 "end_trajectory() it and start over")
    return SandboxSpecError(str(where), str(reason))


def end_of(payload: bytes, oom_before: int) -> End:
    """The :class:`End` of an ``X`` frame."""
    data = json.loads(payload)
    blocks = data.get("workdir")
    used = None if not blocks else max(int(blocks[0]) - int(blocks[1]), 0) * int(blocks[2])
    return End(status=data.get("status"), timed_out=bool(data.get("timed_out")),
               elapsed_s=float(data.get("elapsed_s", 0.0)), oom_before=oom_before,
               oom_after=int(data.get("oom", oom_before)), workdir_bytes=used)


class Resident:
    """A started resident executor: the exec's socket and what is read from it."""

    def __init__(self, handle: Any, sock: socket.socket, first: bytes) -> None:
        self._handle = handle
        self.sock = sock
        self._docker = FrameDemuxer()
        self._frames = Frames()
        self._queue: deque[tuple[bytes, bytes]] = deque()
        self.diagnostics = CappedBuffer(4096)
        self.pid = 0
        self._next_id = 0
        self._reads = selectors.DefaultSelector()
        self._reads.register(sock, selectors.EVENT_READ)
        self._take(first)

    @classmethod
    def start(cls, client: Any, container_id: str, timeout_s: float, uid: int) -> Resident:
        """Exec the resident (its actions run as ``uid``) in the container and wait for its
        ready frame; raises Broken."""
        try:
            exec_id = client.api.exec_create(
                container_id, ["python3", "-I", "-S", "-c", SOURCE, str(uid)],
                stdin=True, stdout=True, stderr=True, tty=False, user=ROOT, workdir="/",
                environment={})["Id"]
            handle = client.api.exec_start(exec_id, socket=True)
        except API_ERRORS as exc:
            raise Broken(f"cannot start the container's executor: {exc}") from exc
        sock = raw_socket(handle)
        sock.setblocking(False)
        link = cls(handle, sock, read_ahead(handle))
        try:
            kind, payload = link._next(time.monotonic() + timeout_s, "start")
            if kind != b"R":
                raise Broken(f"the container's executor said {kind!r} before it was ready")
            link.pid = int(json.loads(payload)["pid"])
        except (ResidentLost, TimeoutError, ValueError, KeyError) as exc:
            link.close()
            raise Broken(f"the container's executor did not start: {exc}") from exc
        except BaseException:
            link.close()
            raise
        return link

    def run(self, request: Request, stdout: Sink, stderr: Sink, stamps: Stamps,
            deadline: Callable[[], float],
            probe: Callable[[], str | None] | None = None) -> End | None:
        """Run one action; its End, or None when ``deadline()`` passed first.

        When the resident has not taken the request within :data:`PROBE_AFTER_S`, ``probe()``
        says why the container cannot run it (paused, stopped), or None to keep waiting.
        Raises Broken (before the command started: the container cannot run it),
        SandboxSpecError or WorkdirQuotaError (its files), ResidentLost (after it started).
        """
        self._next_id += 1
        self._send(request.encode(self._next_id), deadline())
        oom_before: int | None = None
        sinks = {b"O": stdout, b"E": stderr}
        probe_at = time.monotonic() + PROBE_AFTER_S if probe is not None else None
        while True:
            limit = deadline() if probe_at is None else min(deadline(), probe_at)
            try:
                frame = self._next(limit, "run")
            except TimeoutError:
                if probe is None or probe_at is None or limit >= deadline():
                    return None
                probe_at = None
                why = probe()
                if why is not None:
                    raise Broken(why) from None
                continue
            except ResidentLost as exc:
                if stamps.started is None:
                    raise Broken(f"the container's executor is gone: {exc}") from exc
                raise
            kind, payload = frame
            if kind in sinks:
                sinks[kind].feed(payload, time.monotonic())
            elif kind == b"K":
                oom_before = int(json.loads(payload).get("oom", 0))
                probe_at = None
            elif kind == b"S":
                stamps.started = time.monotonic()
            elif kind == b"X":
                return end_of(payload, oom_before or 0)
            elif kind == b"F":
                raise file_error(payload)
            elif kind == b"B":
                raise Broken(payload.decode("utf-8", "replace"))

    def close(self) -> None:
        """Close the stream: the resident kills what runs and exits."""
        with contextlib.suppress(OSError, KeyError, ValueError):
            self._reads.close()
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(OSError, AttributeError):
            self._handle.close()

    def _send(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        with selectors.DefaultSelector() as sel:
            sel.register(self.sock, selectors.EVENT_WRITE)
            while view:
                if time.monotonic() > deadline or not sel.select(deadline - time.monotonic()):
                    raise Broken("the container's executor stopped reading its requests")
                try:
                    view = view[self.sock.send(view[: 1 << 20]):]
                except BlockingIOError:
                    continue
                except OSError as exc:
                    raise Broken(f"the container's executor is gone: {exc}") from exc

    def _next(self, deadline: float, what: str) -> tuple[bytes, bytes]:
        """The next frame; TimeoutError at ``deadline``, ResidentLost at end of stream."""
        while not self._queue:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(what)
            try:
                if not self._reads.select(min(remaining, 0.5)):
                    continue
                data = self.sock.recv(1 << 16)
            except BlockingIOError:
                continue
            except (OSError, ValueError) as exc:  # ValueError: closed under us (trajectory ended)
                raise ResidentLost(f"its stream broke ({exc})") from exc
            if not data:
                detail = self.diagnostics.text().strip()
                raise ResidentLost("its stream ended" + (f": {detail}" if detail else ""))
            self._take(data)
        return self._queue.popleft()

    def _take(self, data: bytes) -> None:
        for stream, piece in self._docker.feed(data):
            if stream == 1:
                self._queue.extend(self._frames.feed(piece))
            else:
                self.diagnostics.feed(piece, time.monotonic())
