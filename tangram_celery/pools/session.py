"""Python sessions: one interpreter per trajectory whose variables, imports and cwd live on.

A code action with ``"session": true`` in its payload does not run its code itself: it hands it
to the trajectory's session interpreter, a process inside the trajectory's sandbox that the
first such action starts (in its own session, so it outlives the action) and that listens on a
unix socket in the sandbox's ``/tmp``. The action passes its stdin, stdout and stderr with the
code (``SCM_RIGHTS``), so the code's output is the action's output, and exits with the code's
status; a last expression's value is printed, as a notebook shows it. When the interpreter has
died (killed at a time-out, out of memory, or it exited) the next action says so on stderr and
starts a fresh one. The session ends with its trajectory (its sandbox and processes go).

Pure text: :func:`session_program` is the program the action runs in the sandbox.
"""

from __future__ import annotations

import json

KERNEL = r'''
import ast, json, os, socket, struct, sys, traceback
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(sys.argv[1])
server.listen(4)
scope = {"__name__": "__main__", "__builtins__": __builtins__}
sys.path.insert(0, "")
null = os.open("/dev/null", os.O_RDWR)

def run(code):
    try:
        tree = ast.parse(code, "<session>")
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, "<session>", "exec"), scope)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), "<session>", "eval"), scope)
            if value is not None:
                print(repr(value))
        return 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return (exc.code or 0) & 0xFF
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1

while True:
    conn, _ = server.accept()
    try:
        head, extra, _, _ = conn.recvmsg(4, socket.CMSG_SPACE(12))
        fds = [fd for level, kind, data in extra for fd in struct.unpack("3i", data[:12])]
        size, = struct.unpack(">I", head)
        body = b""
        while len(body) < size:
            body += conn.recv(size - len(body))
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        status = run(json.loads(body)["code"])
        sys.stdout.flush()
        sys.stderr.flush()
        for target in (0, 1, 2):
            os.dup2(null, target)
        conn.sendall(str(status).encode())
    except Exception:
        pass
    finally:
        conn.close()
'''
"""The session interpreter's program (it runs in the sandbox, stdlib only)."""

CLIENT = r'''
import array, json, os, socket, struct, subprocess, sys, time
HOME = "/tmp/.tangram-session"
SOCK = HOME + "/sock"

def connect():
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(SOCK)
    return conn

def start():
    os.makedirs(HOME, mode=0o700, exist_ok=True)
    if os.path.exists(SOCK):
        os.unlink(SOCK)
    with open(HOME + "/kernel.py", "w") as fh:
        fh.write(KERNEL)
    subprocess.Popen(["/usr/bin/python3", HOME + "/kernel.py", SOCK], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, cwd="/work")
    for _ in range(1000):
        try:
            return connect()
        except OSError:
            time.sleep(0.01)
    sys.exit("tangram: the session's Python interpreter did not start")

try:
    conn = connect()
except FileNotFoundError:
    conn = start()
except OSError:
    sys.stderr.write("tangram: this session's Python interpreter had died (its variables "
                     "are gone); a fresh one runs this call\n")
    conn = start()
sys.stdout.flush()
sys.stderr.flush()
body = json.dumps({"code": CODE}).encode()
conn.sendmsg([struct.pack(">I", len(body)) + body],
             [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]).tobytes())])
reply = b""
while True:
    chunk = conn.recv(64)
    if not chunk:
        break
    reply += chunk
if not reply:
    sys.stderr.write("tangram: this session's Python interpreter died during this call; the "
                     "next call starts a fresh one\n")
    sys.stderr.flush()
    os._exit(1)
os._exit(int(reply))
'''
"""What each session action runs: hand the code to the interpreter, start it when needed."""


def session_program(code: str) -> str:
    """The Python program of a session action that runs ``code`` in the session."""
    return f"CODE = {json.dumps(code)}\nKERNEL = {json.dumps(KERNEL)}\n{CLIENT}"
