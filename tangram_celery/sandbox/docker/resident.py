"""The docker backend's resident executor: one stdlib process per container, for its whole life.

The node starts it once per container, with one long-lived ``docker exec -i`` as the container's
root (``python3 -I -S -c <this file's source> UID``), and then talks to it over that exec's
stream only: no Docker API call is made per action. The container has no capability but
``SETUID``, ``SETGID`` and ``SETPCAP``, which only root holds, so this process forks each
action's child, which empties its bounding set and drops to ``UID`` (with
``no-new-privileges``: no capability at all) before it touches anything of the action's.

Integrity (the node trusts only what this process and the kernel say):

- actions run as ``UID``, this process as root: they cannot signal it, ptrace it (ptrace is also
  in the seccomp deny-list), nor open its ``/proc/PID/fd`` (it is not dumpable either);
- a child holds none of this process's descriptors: it gets the action's own pipes only;
- the exit status is the child's wait status, read here with ``waitpid``; the output is what this
  process reads from the child's pipes, framed here; nothing the child writes can look like a
  frame;
- before and after every action, every process of ``UID`` is killed, so nothing an action left
  behind can reach the next one.

Wire (the node's side is :mod:`tangram_celery.sandbox.docker.link`). Node to here: a 4-byte
big-endian length, a JSON request ``{"id", "argv", "env", "cwd", "timeout_s", "files":
[[parts, size], ...], "stdin": size | null, "min_pids"}``, then the files' bytes and the stdin
bytes. Here to node, on stdout: frames of one kind byte and a 4-byte big-endian length, then the
payload: ``R`` ready (JSON ``{"pid"}``), ``K`` room was made for an action (JSON
``{"oom"}``: the OOM-kill counter before it), ``S`` the command started, ``O``/``E`` a piece of its
stdout/stderr, ``X`` the end (JSON), ``F`` a file error (JSON ``[kind, where, reason]``), ``B``
the container cannot run actions (text). On EOF it kills every process of ``UID`` and exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import stat
import struct
import sys
import time
from typing import Any

REQUEST = struct.Struct(">I")
FRAME = struct.Struct(">cI")
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
PIDS_DIRS = ("/sys/fs/cgroup/pids", "/sys/fs/cgroup")
OOM_FILES = ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events")
CHUNK = 1 << 16
PR_CAPBSET_DROP = 24
PR_SET_DUMPABLE = 4
CAPS = (6, 7, 8)  # CAP_SETGID, CAP_SETUID, CAP_SETPCAP; SETPCAP last, as it allows the drops


def send(kind: bytes, payload: bytes) -> None:
    """Write one frame to the node (stdout), whole."""
    data = memoryview(FRAME.pack(kind, len(payload)) + payload)
    while data:
        data = data[os.write(1, data):]


def read_exact(n: int) -> bytes | None:
    """``n`` bytes of stdin; None at EOF."""
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(0, min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def owned_pids(uid: int) -> list[int]:
    """The processes of ``uid`` in this pid namespace (by their real, effective or saved uid,
    not by the owner of ``/proc/PID``, which an undumpable process hands to root)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{name}/status") as fh:
                uids = next(line for line in fh if line.startswith("Uid:")).split()[1:4]
            if str(uid) in uids:
                found.append(int(name))
    return found


def kill_uid(uid: int) -> None:
    """SIGKILL every process of ``uid``, from a child that drops to it (``kill(-1)`` spares it)."""
    for _ in range(20):
        if not owned_pids(uid):
            return
        try:
            pid = os.fork()
        except OSError:  # the pid cap is full: make_room reports it
            return
        if pid == 0:
            try:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
                os.kill(-1, signal.SIGKILL)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        time.sleep(0.001)


def pids_room() -> tuple[int, int] | None:
    """(current, max) of the container's pids cgroup; None when it has no cap."""
    for d in PIDS_DIRS:
        with contextlib.suppress(OSError, ValueError):
            with open(f"{d}/pids.max") as fh:
                cap = fh.read().strip()
            with open(f"{d}/pids.current") as fh:
                current = int(fh.read())
            return None if cap == "max" else (current, int(cap))
    return None


def make_room(uid: int, need: int) -> str | None:
    """Kill what earlier actions left and wait for ``need`` free pids; why not, else None."""
    deadline = time.monotonic() + 2.0
    while True:
        kill_uid(uid)
        room = pids_room()
        if room is None or room[1] - room[0] >= need:
            return None
        if time.monotonic() > deadline:
            return f"pid cap exhausted: {room[0]} of {room[1]} in use"
        time.sleep(0.005)


def oom_kills() -> int:
    """The container's OOM-kill counter."""
    for path in OOM_FILES:
        with contextlib.suppress(OSError, ValueError), open(path) as fh:
            for line in fh:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
            return 0
    return 0


def workdir_blocks(path: str) -> list[int] | None:
    """[blocks, free blocks, block size] of the work dir's file system."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return [st.f_blocks, st.f_bfree, st.f_frsize]


def opendir(parent: int, name: str) -> int:
    """Open (making it if needed) directory ``name`` under ``parent``, never through a link."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise NotADirectoryError(exc.errno, f"{name!r} exists in the work dir and is not a "
                                 f"directory ({exc.strerror}); pick another path") from exc
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o755, dir_fd=parent)
    return os.open(name, DIR_FLAGS, dir_fd=parent)


def write_file(parent: int, name: str, data: memoryview) -> None:
    """Replace file ``name`` under ``parent`` with ``data``, never through a link."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
            raise IsADirectoryError(21, "is a directory in the work dir; pick another path")
        os.unlink(name, dir_fd=parent)
    fd = os.open(name, FILE_FLAGS, 0o644, dir_fd=parent)
    try:
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)


def write_files(cwd: str, files: list[Any], blob: memoryview) -> list[str] | None:
    """Write the spec's files under ``cwd``; [kind, where, reason] of the first failure."""
    root = os.open(cwd, DIR_FLAGS)
    at = 0
    for parts, size in files:
        where = f"files[{'/'.join(parts)!r}]"
        d = root
        try:
            for part in parts[:-1]:
                d = opendir(d, part)
            write_file(d, parts[-1], blob[at:at + size])
        except OSError as exc:
            kind = "quota" if exc.errno in (28, 122) else "spec"
            return [kind, where, f"cannot write it: {exc.strerror}"]
        at += size
    return None


def drop_bounding_caps() -> None:
    """Empty the bounding set of the three capabilities the container has (CAP_SETGID,
    CAP_SETUID, CAP_SETPCAP), so an action's process holds none, not even as a bound."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    for cap in CAPS:
        if prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {cap})")


def child(uid: int, req: dict[str, Any], blob: memoryview, fds: dict[str, int]) -> None:
    """In the forked child: drop to ``uid``, write the files, exec the command. Never returns."""
    try:
        os.setsid()
        drop_bounding_caps()
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        failure = write_files(req["cwd"], req["files"], blob)
        if failure is not None:
            os.write(fds["report"], json.dumps(failure).encode())
            os._exit(125)
        for target, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
            os.dup2(fds[name], target)
        os.closerange(3, fds["report"])
        os.closerange(fds["report"] + 1, 65536)
        os.chdir(req["cwd"])
        argv = [str(a) for a in req["argv"]]
        os.execve(argv[0], argv, {str(k): str(v) for k, v in req["env"].items()})  # nosec B606 # the action's own command, as the sandbox uid
    except BaseException as exc:  # noqa: BLE001 # reported through the report pipe
        with contextlib.suppress(OSError):
            os.write(fds["report"], json.dumps(["spec", "command", repr(exc)]).encode())
    os._exit(125)


class Action:
    """One action in flight: its child, its pipes and its clock."""

    def __init__(self, uid: int, req: dict[str, Any], blob: memoryview, wake: int) -> None:
        self.uid, self.req, self.wake = uid, req, wake
        files_size = sum(size for _, size in req["files"])
        stdin = req.get("stdin")
        self.stdin = blob[files_size:] if stdin is not None else None
        pipes = {name: os.pipe2(os.O_CLOEXEC) for name in ("stdin", "stdout", "stderr", "report")}
        ends = {"stdin": pipes["stdin"][0], "stdout": pipes["stdout"][1],
                "stderr": pipes["stderr"][1], "report": pipes["report"][1]}
        try:
            self.pid = os.fork()
        except OSError:
            for pair in pipes.values():
                for fd in pair:
                    os.close(fd)
            raise
        if self.pid == 0:
            child(uid, req, blob, ends)
        for fd in ends.values():
            os.close(fd)
        self.stdin_fd = pipes["stdin"][1]
        self.reads = {pipes["stdout"][0]: b"O", pipes["stderr"][0]: b"E"}
        self.report = pipes["report"][0]
        self.report_data = b""
        self.started = 0.0
        self.status: int | None = None
        self.ended = 0.0

    def serve(self) -> None:
        """Feed stdin, forward output, reap the child, within the timeout; then report."""
        timed_out = False
        poller = select.poll()
        for fd in (*self.reads, self.report, self.wake):
            poller.register(fd, select.POLLIN)
        self._open_stdin(poller)
        while self.reads or self.report >= 0 or self.status is None:
            limit = None if not self.started else self.started + self.req["timeout_s"]
            if limit is not None and time.monotonic() >= limit and not timed_out:
                timed_out = True
                self._kill()
            wait = None if limit is None or timed_out else max(limit - time.monotonic(), 0)
            for fd, _ in poller.poll(None if wait is None else wait * 1000 + 1):
                self._ready(fd, poller)
            self._reap()
        if self.report_data:
            send(b"F", self.report_data)
            return
        self._end(timed_out)

    def _open_stdin(self, poller: select.poll) -> None:
        if self.stdin is None or not self.stdin:
            os.close(self.stdin_fd)
            self.stdin_fd = -1
            return
        os.set_blocking(self.stdin_fd, False)
        poller.register(self.stdin_fd, select.POLLOUT)

    def _ready(self, fd: int, poller: select.poll) -> None:
        if fd == self.wake:
            with contextlib.suppress(BlockingIOError):
                os.read(self.wake, 4096)
        elif fd == self.stdin_fd and self.stdin is not None:
            try:
                self.stdin = self.stdin[os.write(fd, self.stdin[:CHUNK]):]
            except BlockingIOError:
                return
            except OSError:
                self.stdin = self.stdin[:0]
            if not self.stdin:
                poller.unregister(fd)
                os.close(fd)
                self.stdin_fd = -1
        elif fd == self.report:
            data = os.read(fd, CHUNK)
            self.report_data += data
            if not data:
                self._close(fd, poller)
                self.report = -1
                if not self.report_data:
                    self.started = time.monotonic()
                    send(b"S", b"")
        elif fd in self.reads:
            data = os.read(fd, CHUNK)
            if data:
                send(self.reads[fd], data)
            else:
                self._close(fd, poller)
                del self.reads[fd]

    @staticmethod
    def _close(fd: int, poller: select.poll) -> None:
        poller.unregister(fd)
        os.close(fd)

    def _reap(self) -> None:
        if self.status is not None:
            return
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid:
            self.status, self.ended = status, time.monotonic()
            self._kill()

    def _kill(self) -> None:
        with contextlib.suppress(OSError):
            os.killpg(self.pid, signal.SIGKILL)
        kill_uid(self.uid)

    def _end(self, timed_out: bool) -> None:
        if self.stdin_fd >= 0:
            os.close(self.stdin_fd)
        elapsed = max((self.ended or time.monotonic()) - self.started, 0.0)
        end = {"id": self.req["id"], "status": self.status, "timed_out": timed_out,
               "elapsed_s": elapsed, "oom": oom_kills(), "workdir": workdir_blocks(self.req["cwd"])}
        send(b"X", json.dumps(end).encode())


def serve(uid: int) -> None:
    """Run actions from stdin, one at a time, until the node closes it."""
    wake_r, wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    send(b"R", json.dumps({"pid": os.getpid()}).encode())
    while True:
        head = read_exact(REQUEST.size)
        body = read_exact(REQUEST.unpack(head)[0]) if head is not None else None
        if body is None:
            break
        req = json.loads(body)
        blob_size = sum(size for _, size in req["files"]) + (req.get("stdin") or 0)
        blob = read_exact(blob_size) if blob_size else b""
        if blob is None:
            break
        why = make_room(uid, int(req.get("min_pids", 4)))
        if why is not None:
            send(b"B", why.encode())
            continue
        send(b"K", json.dumps({"oom": oom_kills()}).encode())
        try:
            action = Action(uid, req, memoryview(blob), wake_r)
        except OSError as exc:
            send(b"B", f"cannot start the action's process: {exc}".encode())
            continue
        action.serve()
    kill_uid(uid)


def main() -> None:
    """Serve the node as the container's resident executor for the uid given as ``argv[1]``."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    serve(int(sys.argv[1]))


if __name__ == "__main__":
    main()
