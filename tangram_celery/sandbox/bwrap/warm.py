"""The node's side of a trajectory's warm executor: start it, hand it actions, hear their exits.

One :class:`WarmExecutor` per live sandbox. Its channel is one end of a unix socketpair made
here; the other end is inherited into bubblewrap and nothing else: no path, so no other sandbox
can reach it. A reader thread turns the executor's frames into per-action exit statuses; at EOF
(the executor or its sandbox died) every waiting action learns it is lost.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tangram_celery.errors import SandboxSetupError
from tangram_celery.sandbox.bwrap.executor import recv_frame, send_frame

UCRED = struct.Struct("iII")
LOST = -1
"""What :meth:`WarmExecutor.wait` returns for an action whose executor died."""


@dataclass
class _Pending:
    done: threading.Event = field(default_factory=threading.Event)
    status: int | None = None
    on_exit: Callable[[], None] | None = None


class WarmExecutor:
    """A started executor: its bubblewrap process and the node's end of its channel."""

    def __init__(self, proc: subprocess.Popen[bytes], channel: socket.socket) -> None:
        self.proc = proc
        self.channel = channel
        self.lost = False
        self.inner_pid = 0
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._next_id = 0
        self._reader: threading.Thread | None = None

    @classmethod
    def start(cls, spawn: Callable[[int], subprocess.Popen[bytes]],
              timeout_s: float = 10.0) -> WarmExecutor:
        """Make the channel, ``spawn(inner_fd)`` the sandbox around the executor, wait for it."""
        node_end, inner_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            proc = spawn(inner_end.fileno())
        except BaseException:
            node_end.close()
            raise
        finally:
            inner_end.close()
        executor = cls(proc, node_end)
        executor._wait_ready(timeout_s)
        return executor

    def _wait_ready(self, timeout_s: float) -> None:
        self.channel.settimeout(timeout_s)
        try:
            frame = recv_frame(self.channel)
        except (OSError, ValueError) as exc:
            frame = None
            reason = str(exc)
        else:
            reason = "it exited"
        self.channel.settimeout(None)
        if frame is None or frame[0].get("event") != "ready":
            detail = self._startup_error()
            self.close()
            raise SandboxSetupError(
                f"the sandbox's warm executor did not start ({reason}): {detail}"
            )
        self.inner_pid = int(frame[0].get("pid", 0))
        self._reader = threading.Thread(target=self._read, name="tangram-executor-reader",
                                        daemon=True)
        self._reader.start()

    def _startup_error(self) -> str:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            _, err = self.proc.communicate(timeout=2.0)
            return (err or b"").decode(errors="replace").strip() or "no message"
        return "no message"

    def submit(self, request: dict[str, Any], fds: list[int],
               on_exit: Callable[[], None] | None = None) -> int:
        """Send one ``run`` request with its fds; its id. ``on_exit`` runs when the child exits,
        before :meth:`wait` returns (to kill what the action left)."""
        with self._lock:
            self._next_id += 1
            action = self._next_id
            self._pending[action] = _Pending(on_exit=on_exit)
            lost = self.lost
        if lost:
            self._finish(action, None)
            return action
        try:
            with self._send_lock:
                send_frame(self.channel, {**request, "op": "run", "id": action}, fds)
        except OSError:
            self._mark_lost()
        return action

    def wipe(self, timeout_s: float = 10.0) -> bool:
        """Have the executor kill everything else in the sandbox and empty its writable dirs
        (see :func:`~tangram_celery.sandbox.bwrap.executor.wipe_sandbox`); True when it says
        all of it was done, False when it could not or did not answer in time."""
        with self._lock:
            self._next_id += 1
            job = self._next_id
            self._pending[job] = _Pending()
        try:
            with self._send_lock:
                send_frame(self.channel, {"op": "wipe", "id": job})
        except OSError:
            self._mark_lost()
        return self.wait(job, timeout_s) == 0

    def kill(self, action: int) -> None:
        """Ask the executor to SIGKILL the action's process group."""
        with contextlib.suppress(OSError), self._send_lock:
            send_frame(self.channel, {"op": "kill", "id": action})

    def wait(self, action: int, timeout_s: float) -> int | None:
        """The child's wait status, :data:`LOST` if the executor died, None on timeout."""
        with self._lock:
            pending = self._pending.get(action)
        if pending is None or not pending.done.wait(timeout_s):
            return None
        with self._lock:
            self._pending.pop(action, None)
        return LOST if pending.status is None else pending.status

    def _read(self) -> None:
        while True:
            try:
                frame = recv_frame(self.channel)
            except (OSError, ValueError):
                frame = None
            if frame is None:
                self._mark_lost()
                return
            message, fds = frame
            for fd in fds:
                os.close(fd)
            if message.get("event") in ("exit", "error", "wiped"):
                status = message.get("status")
                self._finish(int(message.get("id", -1)),
                             int(status) if isinstance(status, int) else None)

    def _finish(self, action: int, status: int | None) -> None:
        with self._lock:
            pending = self._pending.get(action)
        if pending is None:
            return
        if pending.on_exit is not None:
            with contextlib.suppress(Exception):
                pending.on_exit()
        pending.status = status
        pending.done.set()

    def _mark_lost(self) -> None:
        with self._lock:
            self.lost = True
            waiting = list(self._pending)
        for action in waiting:
            self._finish(action, None)

    def alive(self) -> bool:
        """Whether the executor still answers (its channel is open, its sandbox running)."""
        return not self.lost and self.proc.poll() is None

    def close(self) -> None:
        """Close the channel (the executor kills its sandbox and exits) and reap bubblewrap."""
        with contextlib.suppress(OSError):
            self.channel.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.channel.close()
        try:
            self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self._mark_lost()


def child_pid(control: socket.socket, deadline: float) -> int | None:
    """The host pid of an action's child, from the credentials it sent on its control socket
    (the kernel translates its pid into ours); None when it never came."""
    control.settimeout(max(deadline - time.monotonic(), 0.001))
    try:
        data, ancillary, _, _ = control.recvmsg(1, socket.CMSG_SPACE(UCRED.size))
    except OSError:
        return None
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and data == b"r":
            pid, _, _ = UCRED.unpack(payload[: UCRED.size])
            return int(pid)
    return None


def control_pair() -> tuple[socket.socket, socket.socket]:
    """A per-action control socketpair: (the node's end, which sees credentials; the child's)."""
    node_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    node_end.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    return node_end, child_end
