"""The warm executor's integrity: an action cannot tamper with the executor or forge later results.

Each test is an attack that succeeds if the protection it names is missing: the executor as the
sandbox's pid 1 (signals), ``PR_SET_DUMPABLE 0`` (ptrace, ``/proc/1/fd``, ``/proc/1/mem``), the
seccomp filter's ``ptrace`` refusal (other actions' processes), the node's own pipes and the
cleanup of everything an action leaves (forged later output), the cgroup placement before user
code, and the ``sandbox_lost`` result when the executor dies.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_sandbox_attacks import SMALL_LIMITS, Run, py

from tangram_celery.errors import SandboxLostError
from tangram_celery.sandbox import ExecOutcome, ExecSpec
from tangram_celery.sandbox.bwrap import BwrapBackend


def _executor_pids(backend: BwrapBackend, tid: str = "t1") -> tuple[int, int]:
    """(bubblewrap's host pid, the executor's host pid) of a live trajectory."""
    executor = backend._trajs[tid].executor
    assert executor is not None
    bwrap = executor.proc.pid
    children = Path(f"/proc/{bwrap}/task/{bwrap}/children").read_text().split()
    assert len(children) == 1, children
    return bwrap, int(children[0])


@pytest.fixture()
def no_seccomp(sandbox_tools: None, sandbox_root: Path) -> Iterator[BwrapBackend]:
    """A backend without the seccomp filter, to test what holds without it."""
    b = BwrapBackend(sandbox_root, SMALL_LIMITS, seccomp=False)
    try:
        yield b
    finally:
        b.close()


def _run(backend: BwrapBackend, command: str, tid: str = "t1", **kw: object) -> ExecOutcome:
    return backend.run(ExecSpec(tid, command, {}, 20.0, (0,), **kw))  # type: ignore[arg-type]


def test_signals_cannot_reach_the_executor(run: Run, backend: BwrapBackend) -> None:
    run("echo kept > state.txt")
    before = _executor_pids(backend)
    attack = """
import os, signal
for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP, signal.SIGINT, signal.SIGHUP,
            signal.SIGSEGV, signal.SIGUSR1):
    os.kill(1, sig)
try:
    os.kill(-1, signal.SIGKILL)
except ProcessLookupError:
    pass
print("SENT", flush=True)
"""
    out = run("unused", files={"attack.py": attack}, python="attack.py")
    assert "SENT" in out.stdout and out.exit_code == 0, out.stderr
    after = run("cat state.txt; echo $$")
    assert after.stdout.startswith("kept\n") and after.exit_code == 0
    assert _executor_pids(backend) == before, "the executor was killed and replaced"


def test_the_executor_cannot_be_ptraced_or_read_through_proc(no_seccomp: BwrapBackend) -> None:
    attack = py("""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for name, req in (("ATTACH", 16), ("SEIZE", 0x4206)):
    r = libc.ptrace(req, 1, None, None)
    print(name, r, ctypes.get_errno(), flush=True)
for path in ("/proc/1/mem", "/proc/1/fd/0", "/proc/1/environ"):
    try:
        open(path, "rb").read(1)
        print("OPENED", path, flush=True)
    except OSError as exc:
        print("REFUSED", path, exc.errno, flush=True)
try:
    print("FDS", os.listdir("/proc/1/fd"), flush=True)
except OSError as exc:
    print("FDS REFUSED", exc.errno, flush=True)
""")
    out = _run(no_seccomp, attack)
    assert "ATTACH -1" in out.stdout and "SEIZE -1" in out.stdout, out.stdout + out.stderr
    assert "OPENED" not in out.stdout and "FDS [" not in out.stdout, out.stdout
    assert _run(no_seccomp, "echo alive").stdout == "alive\n"


def test_actions_cannot_ptrace_each_others_processes(run: Run) -> None:
    attack = py("""
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
pid = os.fork()
if pid == 0:
    time.sleep(5)
    os._exit(0)
r = libc.ptrace(16, pid, None, None)
print("ATTACH", r, ctypes.get_errno(), flush=True)
os.kill(pid, 9)
""")
    out = run(attack)
    assert "ATTACH -1 1" in out.stdout, out.stdout + out.stderr


# A process left behind that writes into every other process's stdout and stderr for 6 s, and
# the later action it would forge: it must print "real" alone and exit 3.
FORGER = py("""
import os, subprocess
script = '''
import os, time
end = time.time() + 6
while time.time() < end:
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        for fd in ("1", "2"):
            try:
                with open(f"/proc/{pid}/fd/{fd}", "w") as fh:
                    fh.write("FORGED 0 passed\\\\n")
            except OSError:
                pass
    try:
        open("/work/forger-alive", "w").close()
    except OSError:
        pass
    time.sleep(0.01)
'''
subprocess.Popen(["setsid", "python3", "-c", script], stdin=subprocess.DEVNULL,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
print("PLANTED", flush=True)
""")
VICTIM = "rm -f forger-alive; sleep 0.5; echo real; ls forger-alive 2>/dev/null; exit 3"


def assert_not_forged(victim: ExecOutcome) -> None:
    """The later action's output and status are its own."""
    assert victim.stdout == "real\n" and victim.exit_code == 3, victim
    assert "FORGED" not in victim.stderr


@pytest.fixture(params=["cgroups", "no-cgroups"])
def either(request: pytest.FixtureRequest, sandbox_tools: None,
           sandbox_root: Path) -> Iterator[BwrapBackend]:
    """A backend with its cgroups, and one without (rlimits and the executor's kills only)."""
    b = BwrapBackend(sandbox_root, SMALL_LIMITS, cgroups=request.param == "cgroups",
                      enforce="best-effort")
    try:
        yield b
    finally:
        b.close()


def test_a_leftover_process_cannot_forge_a_later_actions_output(either: BwrapBackend) -> None:
    def run(command: str) -> ExecOutcome:
        return _run(either, command)

    assert "PLANTED" in run(FORGER).stdout
    time.sleep(0.3)
    assert_not_forged(run(VICTIM))


def test_the_child_is_in_its_cgroup_and_on_its_cores_before_user_code(
    run: Run, backend: BwrapBackend, two_cores: tuple[int, int]
) -> None:
    assert backend.cgroups is not None and "cpuset" in backend.cgroups.controllers
    second = two_cores[1]
    shell = run("cat /proc/self/cgroup; grep Cpus_allowed_list /proc/self/status",
                cores=(second,))
    code = "print(open('/proc/self/cgroup').read()); print(open('/proc/self/status').read())"
    python = backend.run(ExecSpec("t1", "unused", {"c.py": code}, 20.0, (second,),
                                  python="c.py"))
    for out in (shell, python):
        groups = dict(line.split(":", 2)[1:] for line in out.stdout.splitlines()
                      if line.count(":") >= 2 and line.split(":", 1)[0].isdigit())
        for controller in backend.cgroups.controllers:
            base, name = groups[controller].rstrip("/").split("/")[-2:]
            assert base == backend.cgroups.bases[controller].name, groups
            assert name.startswith("t"), groups  # the trajectory's own groups, born inside
        assert f"Cpus_allowed_list:\t{second}\n" in out.stdout, out.stdout


def test_a_concurrent_action_gets_groups_of_its_own_before_user_code(
    run: Run, backend: BwrapBackend, two_cores: tuple[int, int]
) -> None:
    assert backend.cgroups is not None and "cpuset" in backend.cgroups.controllers
    first, second = two_cores
    report = "cat /proc/self/cgroup; grep Cpus_allowed_list /proc/self/status"
    outs: list[ExecOutcome] = []
    holder = threading.Thread(target=lambda: outs.append(run(f"{report}; sleep 1.5",
                                                             cores=(first,))))
    holder.start()
    time.sleep(0.5)
    other = run(report, cores=(second,))
    holder.join(10)
    names = []
    for out, core in ((outs[0], first), (other, second)):
        groups = dict(line.split(":", 2)[1:] for line in out.stdout.splitlines()
                      if line.count(":") >= 2 and line.split(":", 1)[0].isdigit())
        names.append({groups[c].rstrip("/").split("/")[-1][0] for c in backend.cgroups.controllers})
        assert f"Cpus_allowed_list:\t{core}\n" in out.stdout, out.stdout
    assert names == [{"t"}, {"a"}], names


def test_a_dead_executor_gives_sandbox_lost_and_the_trajectory_goes_on(
    run: Run, backend: BwrapBackend
) -> None:
    run("echo kept > state.txt")
    _, executor = _executor_pids(backend)
    errors: list[BaseException] = []

    def long_action() -> None:
        try:
            run("sleep 20")
        except BaseException as exc:  # noqa: BLE001 # the test inspects it
            errors.append(exc)

    worker = threading.Thread(target=long_action)
    worker.start()
    time.sleep(0.5)
    os.kill(executor, signal.SIGKILL)
    worker.join(15)
    assert not worker.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], SandboxLostError), errors
    assert "sandbox_lost" in str(errors[0])
    after = run("cat state.txt")
    assert after.stdout == "kept\n" and after.exit_code == 0
    assert _executor_pids(backend)[1] != executor
