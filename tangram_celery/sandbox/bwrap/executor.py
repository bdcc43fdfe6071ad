"""The warm executor: a small stdlib-only process that lives inside a trajectory's sandbox.

The node starts it once per sandbox (``python3 -I -c <this file's source> FD``) inside the
sandbox's namespaces, uid, seccomp filter and rlimits, as the sandbox's pid 1. It keeps an
interpreter loaded and, for each action, forks a child that runs a shell command (``execve`` of
``/bin/sh -c``) or a Python script (in the forked interpreter: no interpreter start). It reads
nothing but the channel ``FD``, a unix stream socket whose other end only the node holds.

Integrity (the node trusts only what this process and the kernel say):

- it is the pid namespace's init and installs no handler for a terminating signal, so the
  kernel drops every signal an action sends it (SIGKILL included);
- it is not dumpable (``PR_SET_DUMPABLE 0``): actions cannot ptrace it, nor open its
  ``/proc/1/mem`` or ``/proc/1/fd``;
- a child closes the channel before anything else, so actions never hold it;
- the node passes each action's stdin, stdout and stderr (its own pipes) and a per-action
  control socket over the channel (``SCM_RIGHTS``); a child that must be placed first
  (``wait_go``: moved into cgroups of its own, or narrowed to its cores where no cpuset holds
  them) sends its kernel-attested pid on the control socket (``SCM_CREDENTIALS``), waits for the
  node's go byte (the node first places it from outside), and only then runs user code; one
  born in the trajectory's cgroups, which already pin it, runs at once (a command is then
  started with ``posix_spawn``, which copies nothing of this process); a failure before user
  code runs (the exec of the command, its work dir) is told on the control socket,
  which a forked child holds until then (close-on-exec), so the node never reads it as the
  action's exit status;
- the exit status is the child's wait status, read here with ``waitpid``, never anything the
  child writes.

Frames on the channel are a 4-byte big-endian length and a JSON object. The node sends
``{"op": "run", "id", "argv" | "python", "env", "cwd", "kill_all", "wait_go"}`` with
four fds (stdin, stdout, stderr, control) (and ``"rlimits"``, set in the child before user
code), ``{"op": "kill", "id"}`` and ``{"op": "wipe", "id"}`` (a recycled sandbox between two
requests: :func:`wipe_sandbox`); this process answers ``{"event": "ready", "pid"}`` once, then
``{"event": "exit", "id", "status"}`` per action (or ``{"event": "error", "id", "message"}``)
and ``{"event": "wiped", "id", "status", "message"}``. On EOF it kills everything in the
sandbox and exits.
"""

from __future__ import annotations

import array
import atexit
import contextlib
import ctypes
import json
import os
import resource
import select
import signal
import socket
import struct
import sys
import traceback
from typing import Any

PR_SET_DUMPABLE = 4
HEADER = struct.Struct(">I")
MAX_FRAME = 4 * 1024 * 1024
FDS_PER_RUN = 4


def send_frame(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    """Send one frame, with ``fds`` attached to its first byte."""
    body = json.dumps(message, separators=(",", ":")).encode()
    data = HEADER.pack(len(body)) + body
    if fds:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
        sent = sock.sendmsg([data], ancillary)
        data = data[sent:]
    if data:
        sock.sendall(data)


def recv_frame(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """One frame and the fds that came with it; None at EOF."""
    fds: list[int] = []
    buf = b""
    need = HEADER.size
    have_header = False
    while True:
        while len(buf) < need:
            chunk, ancillary, _, _ = sock.recvmsg(need - len(buf), socket.CMSG_SPACE(64 * 4))
            for level, kind, data in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    usable = len(data) - len(data) % 4
                    fds.extend(array.array("i", data[:usable]))
            if not chunk:
                for fd in fds:
                    os.close(fd)
                return None
            buf += chunk
        if have_header:
            return json.loads(buf), fds
        (size,) = HEADER.unpack(buf)
        if size > MAX_FRAME:
            raise ValueError(f"frame of {size} bytes")
        buf, need, have_header = b"", size, True


def _undumpable() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0)")


def _child(channel: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: drop the channel, wait to be placed, run the action. Never returns.

    Until user code runs, the control socket stays open (it is close-on-exec, and closed before
    a Python action's code): a failure up to then is told there (``e`` and the reason), so the
    node knows the action did not start, rather than reading a user exit status.
    """
    code = 125
    ctl: socket.socket | None = None
    try:
        channel.close()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        stdin, stdout, stderr, control = fds
        for target, fd in ((0, stdin), (1, stdout), (2, stderr)):
            os.dup2(fd, target)
        ctl = socket.socket(fileno=control)
        ctl.set_inheritable(False)
        if request.get("wait_go", True):
            creds = struct.pack("3i", os.getpid(), os.getuid(), os.getgid())
            ctl.sendmsg([b"r"], [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, creds)])
            if ctl.recv(1) != b"g":
                os._exit(125)
        for which, soft, hard in request.get("rlimits", []):
            resource.setrlimit(int(which), (int(soft), int(hard)))
        os.closerange(3, ctl.fileno())
        os.closerange(ctl.fileno() + 1, 65536)
        os.chdir(request.get("cwd", "/"))
        argv, env = _command(request)
        if "python" in request:
            code = _run_python(str(request["python"]), env, ctl)
        else:
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            os.execve(argv[0], argv, env)  # nosec B606 # the action's own argv, inside its sandbox
    except BaseException as exc:  # noqa: BLE001 # told on the control socket and stderr
        code = 126
        _not_started(-1 if ctl is None else ctl.fileno(), 2, exc)
    os._exit(code)


def _command(request: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """The request's argv (empty for Python code) and environment, as strings."""
    return ([str(a) for a in request.get("argv", [])],
            {str(k): str(v) for k, v in request.get("env", {}).items()})


def _spawnable(request: dict[str, Any], cwd: str) -> bool:
    """Whether an action's child can be spawned rather than forked: a command (not Python
    code for this interpreter) run where it is born (nothing to wait for: its cgroups already
    pin it), in this process's work dir ``cwd``."""
    return ("argv" in request and not request.get("wait_go", True)
            and request.get("cwd") == cwd and not request.get("rlimits"))


def _not_started(ctl_fd: int, stderr_fd: int, exc: BaseException) -> None:
    """Tell why the action could not start on its control socket (``-1``: already closed,
    user code ran) and its stderr."""
    reason = f"the action could not start: {type(exc).__name__}: {exc}"
    with contextlib.suppress(BaseException):
        os.write(stderr_fd, f"tangram: {reason}\n".encode())
    if ctl_fd >= 0:
        with contextlib.suppress(BaseException):
            os.write(ctl_fd, b"e" + reason.encode()[:4000])


def _run_python(path: str, env: dict[str, str], ctl: socket.socket) -> int:
    """Run ``path`` as ``__main__`` in this (forked) interpreter; its exit code. ``ctl`` is
    closed before the script's code runs."""
    os.environ.clear()
    os.environ.update(env)
    ctl.close()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = [path]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    code = 0
    try:
        with open(path, "rb") as fh:
            source = fh.read()
        compiled = compile(source, path, "exec")
        exec(compiled, {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__})  # nosec B102 # the action's own code, in its own sandboxed process
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:  # noqa: BLE001 # like the interpreter: print the traceback, exit 1
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001
        code = code or 120
    return code


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


class Executor:
    """The executor's state: its channel and its running children (pid -> action id)."""

    def __init__(self, channel: socket.socket) -> None:
        self.channel = channel
        self.children: dict[int, int] = {}
        self.by_id: dict[int, int] = {}
        self.kill_all: dict[int, bool] = {}
        self.cwd = os.getcwd()

    def handle(self, message: dict[str, Any], fds: list[int]) -> None:
        """Act on one frame from the node."""
        if message.get("op") == "run":
            self.start(message, fds)
        elif message.get("op") == "kill":
            pid = self.by_id.get(int(message.get("id", -1)))
            if pid is not None:
                self._kill_tree(pid, int(message.get("id", -1)))
        elif message.get("op") == "wipe":
            self.wipe(int(message.get("id", -1)))
        for fd in fds:
            os.close(fd)

    def start(self, request: dict[str, Any], fds: list[int]) -> None:
        """Fork the child of one action."""
        action = int(request["id"])
        if len(fds) != FDS_PER_RUN:
            send_frame(self.channel, {"event": "error", "id": action,
                                      "message": f"got {len(fds)} fds, want {FDS_PER_RUN}"})
            return
        if _spawnable(request, self.cwd):
            pid = self._spawn(request, fds)
            if pid is None:
                return
        else:
            try:
                pid = os.fork()
            except OSError as exc:
                send_frame(self.channel, {"event": "error", "id": action,
                                          "message": f"fork failed: {exc}"})
                return
            if pid == 0:
                _child(self.channel, request, fds)
        self.children[pid] = action
        self.by_id[action] = pid
        self.kill_all[action] = bool(request.get("kill_all"))

    def _spawn(self, request: dict[str, Any], fds: list[int]) -> int | None:
        """Start a command that needs no placing with ``posix_spawn`` (no copy of this
        process, unlike a fork): its pid, or None when it could not start (told on the
        control socket, with an exit status of 126, as a forked child tells it)."""
        stdin, stdout, stderr, control = fds
        for fd in fds:
            os.set_inheritable(fd, False)
        argv, env = _command(request)
        try:
            return os.posix_spawn(
                argv[0], argv, env, setsid=True, setsigdef=(signal.SIGPIPE,),
                file_actions=[(os.POSIX_SPAWN_DUP2, stdin, 0), (os.POSIX_SPAWN_DUP2, stdout, 1),
                              (os.POSIX_SPAWN_DUP2, stderr, 2)],
            )  # nosec B606 # the action's own argv, inside its sandbox
        except (OSError, ValueError) as exc:
            _not_started(control, stderr, exc)
            send_frame(self.channel, {"event": "exit", "id": int(request["id"]),
                                      "status": 126 << 8})
            return None

    def wipe(self, action: int) -> None:
        """Make the sandbox as it was when it started (see :func:`wipe_sandbox`); answers
        ``{"event": "wiped", "id", "status"}``, status 0 when all of it was done."""
        problem = wipe_sandbox()
        for pid, finished in list(self.children.items()):
            self.children.pop(pid, None)
            self.by_id.pop(finished, None)
            send_frame(self.channel, {"event": "exit", "id": finished, "status": 9})
        send_frame(self.channel, {"event": "wiped", "id": action, "status": 1 if problem else 0,
                                  "message": problem})

    def reap(self) -> None:
        """Reap every exited process; report the actions' children."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            action = self.children.pop(pid, None)
            if action is None:
                continue
            self.by_id.pop(action, None)
            self._kill_tree(pid, action)
            self.kill_all.pop(action, None)
            send_frame(self.channel, {"event": "exit", "id": action, "status": status})

    def _kill_tree(self, pid: int, action: int) -> None:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        if self.kill_all.get(action) and not [a for a in self.children.values() if a != action]:
            with contextlib.suppress(OSError):
                os.kill(-1, signal.SIGKILL)


WIPED_DIRS = ("/tmp", "/dev/shm", "/work")  # nosec B108 # the sandbox's own tmpfs mounts


def wipe_sandbox(timeout_s: float = 5.0) -> str:
    """Kill every other process of the sandbox and reap them, empty its writable dirs and
    remove its System V IPC objects; '' when done, else what was left."""
    with contextlib.suppress(OSError):
        os.kill(-1, signal.SIGKILL)
    for _ in range(int(timeout_s * 1000)):
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                select.select([], [], [], 0.001)
        except ChildProcessError:
            break
    else:
        return "processes left after SIGKILL"
    try:
        for path in WIPED_DIRS:
            os.chmod(path, 0o700 if path == "/work" else 0o1777)
            _empty(path)
        libc = ctypes.CDLL(None, use_errno=True)
        for table, call in (("shm", libc.shmctl), ("msg", libc.msgctl), ("sem", libc.semctl)):
            with open(f"/proc/sysvipc/{table}") as fh:
                for row in fh.read().splitlines()[1:]:
                    if call(int(row.split()[1]), 0, 0, None) != 0:
                        return f"cannot remove System V {table} {row.split()[1]}"
    except (OSError, RecursionError) as exc:
        return f"cannot wipe: {exc}"
    return ""


def _empty(path: str) -> None:
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            os.chmod(entry.path, 0o700)
            _empty(entry.path)
            os.rmdir(entry.path)
        else:
            os.unlink(entry.path)


def main() -> None:
    """Serve the channel given as ``argv[1]`` until the node closes it."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    _undumpable()
    channel = socket.socket(fileno=int(sys.argv[1]))
    channel.set_inheritable(False)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    null = os.open("/dev/null", os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(null, target)
    os.close(null)
    executor = Executor(channel)
    send_frame(channel, {"event": "ready", "pid": os.getpid()})
    poller = select.poll()
    poller.register(channel.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while True:
        for fd, _ in poller.poll():
            if fd == wake_r:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
                continue
            frame = recv_frame(channel)
            if frame is None:
                with contextlib.suppress(OSError):
                    os.kill(-1, signal.SIGKILL)
                os._exit(0)
            executor.handle(*frame)
        executor.reap()


if __name__ == "__main__":
    main()
