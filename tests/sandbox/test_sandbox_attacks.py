"""The shared adversarial suite: each test FAILS if its attack succeeds, on every backend.

Every attack runs through the ``sandbox``/``sandbox_run`` fixtures, parametrized over the
enforcement modes this machine can run (``[bwrap]``, ``[rlimits]`` and ``[docker]``; see
tests/sandbox/conftest.py). Where a mode does not hold a limit by design (``rlimits``: memory
across processes), the test checks that the backend says so instead (:func:`enforced`). Each
is bounded in time and count (timeouts, loop limits) and targets loopback or this machine
only. The few tests at the end use the
bubblewrap backend's own mechanisms (``backend``/``run``).
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tangram_celery.errors import SandboxSpecError
from tangram_celery.sandbox import ExecOutcome, SandboxBackend, SandboxLimits, WorkdirQuotaError
from tangram_celery.sandbox.bwrap import BwrapBackend
from tangram_celery.sandbox.output import CUT_MARKER

Run = Callable[..., ExecOutcome]
# the limits every `sandbox` fixture uses (tests/sandbox/conftest.py)
SMALL_LIMITS = SandboxLimits(
    memory_mb=256, pids=64, file_size_mb=8, workdir_mb=32, tmp_mb=16, nofile=128,
    output_cap_bytes=4096,
)

MB = 1024 * 1024
REPO = Path(__file__).resolve().parents[2]


def py(code: str) -> str:
    """A shell command running ``code`` with the sandbox's system python."""
    return "python3 - <<'PYEOF'\n" + code.strip() + "\nPYEOF\n"


def enforced(sandbox: SandboxBackend, limit: str) -> bool:
    """Whether the backend holds ``limit`` here. A backend that does not must have said so: it
    runs best-effort and names the gap (a strict one would have refused to start)."""
    if limit not in sandbox.isolation.gaps:
        return True
    assert sandbox.isolation.mode == "best-effort", sandbox.isolation
    assert limit in sandbox.isolation.summary()
    return False


# -- time -------------------------------------------------------------------------------------


def test_infinite_loop_is_killed_at_the_timeout(sandbox_run: Run, token: str,
                                                assert_gone: Callable[[str], None]) -> None:
    t0 = time.monotonic()
    out = sandbox_run(f"trap '' TERM INT HUP; exec sh -c 'while :; do :; done' {token}",
                      timeout_s=1.0)
    elapsed = time.monotonic() - t0
    assert out.timed_out and out.exit_code is None and out.signal == 9
    assert elapsed < 4.0, f"timeout of 1 s took {elapsed:.1f} s to enforce"
    assert_gone(token)


def test_timeout_kills_the_whole_tree(sandbox_run: Run, token: str,
                                      assert_gone: Callable[[str], None]) -> None:
    cmd = f"for i in 1 2 3; do sh -c 'sleep 60; : {token}' & done; sleep 60"
    out = sandbox_run(cmd, timeout_s=0.5)
    assert out.timed_out
    assert_gone(token)


# -- memory -----------------------------------------------------------------------------------


def test_one_gib_allocation_fails(sandbox_run: Run) -> None:
    out = sandbox_run(py("b = bytearray(1 << 30)\nprint('ALLOCATED', flush=True)"))
    assert "ALLOCATED" not in out.stdout
    assert out.exit_code != 0


def test_touching_memory_stops_below_the_limit(sandbox_run: Run) -> None:
    code = """
chunks = []
for i in range(16):          # up to 1 GiB in 64 MiB chunks, every page touched
    chunks.append(bytearray(b"x" * (64 << 20)))
    print("HELD", (i + 1) * 64, flush=True)
"""
    out = sandbox_run(py(code), timeout_s=30)
    held = [int(line.split()[1]) for line in out.stdout.splitlines() if line.startswith("HELD")]
    assert out.exit_code != 0
    assert max(held, default=0) <= SMALL_LIMITS.memory_mb, f"held {max(held)} MiB"


def test_memory_is_capped_across_processes(sandbox_run: Run, sandbox: SandboxBackend) -> None:
    if not enforced(sandbox, "memory"):
        return
    code = """
import os, time
kids = []
for i in range(3):           # 3 x 120 MiB, each under the per-process limit, 360 > 256 MiB
    pid = os.fork()
    if pid == 0:
        b = bytearray(b"x" * (120 << 20))
        time.sleep(1.5)
        os._exit(0)
    kids.append(pid)
ok = sum(1 for p in kids if os.waitpid(p, 0)[1] == 0)
print("SURVIVORS", ok, flush=True)
"""
    out = sandbox_run(py(code), timeout_s=30)
    assert "SURVIVORS 3" not in out.stdout, out.stdout
    assert out.oom_killed


# -- processes and threads ----------------------------------------------------------------------


FORK_BOMB = """
import os, sys, time
n = 0
for i in range(1000):        # bounded: at most 1000 children, each lives 2 s
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(2)
        os._exit(0)
    n += 1
print("FORKED", n, flush=True)
time.sleep(2)
"""

THREAD_BOMB = """
import threading
stop = threading.Event()
n = 0
for i in range(2000):        # bounded: at most 2000 threads, each waits at most 3 s
    try:
        threading.Thread(target=stop.wait, args=(3,), daemon=True).start()
    except (RuntimeError, MemoryError):
        break
    n += 1
print("THREADS", n, flush=True)
stop.set()
"""


def test_bounded_fork_bomb_is_capped_and_does_not_starve_others(
    sandbox_run: Run, token: str, assert_gone: Callable[[str], None]
) -> None:
    results: dict[str, ExecOutcome] = {}

    def bomb() -> None:
        results["bomb"] = sandbox_run(py(FORK_BOMB) + f"# {token}", tid="bomber", timeout_s=20)

    thread = threading.Thread(target=bomb)
    thread.start()
    time.sleep(1.0)   # the bomb now holds every process it could get
    other = sandbox_run("for i in $(seq 20); do sleep 0.2 & done; wait; echo NEIGHBOUR_OK",
                        tid="neighbour", cores=(0,), timeout_s=20)
    thread.join(30)
    forked = [int(line.split()[1]) for line in results["bomb"].stdout.splitlines()
              if line.startswith("FORKED")]
    assert forked and forked[0] < SMALL_LIMITS.pids, f"fork bomb got {forked} processes"
    assert "NEIGHBOUR_OK" in other.stdout, other.stderr
    assert_gone(token)


def test_thread_bomb_is_capped(sandbox_run: Run) -> None:
    out = sandbox_run(py(THREAD_BOMB), timeout_s=30)
    counts = [int(line.split()[1]) for line in out.stdout.splitlines()
              if line.startswith("THREADS")]
    assert counts and counts[0] < SMALL_LIMITS.pids, f"thread bomb got {counts} threads"
    assert "NEXT_OK" in sandbox_run("echo NEXT_OK").stdout


def test_double_forked_setsid_escapee_dies_with_the_action(
    sandbox_run: Run, token: str, assert_gone: Callable[[str], None]
) -> None:
    cmd = (f"(setsid sh -c 'trap \"\" HUP TERM; sleep 30; : {token}' </dev/null >/dev/null 2>&1 &);"
           f" (nohup sh -c 'sleep 30; : {token}' >/dev/null 2>&1 &); echo LAUNCHED")
    out = sandbox_run(cmd)
    assert "LAUNCHED" in out.stdout and out.exit_code == 0
    assert_gone(token)


def test_no_process_of_an_action_outlives_it(
    sandbox_run: Run, token: str, assert_gone: Callable[[str], None]
) -> None:
    for _ in range(3):
        sandbox_run(f"(sleep 30 &); (sh -c 'sleep 30; : {token}' &); sh -c 'exit 0' & wait")
    assert_gone(token)
    out = sandbox_run("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done "
                      "2>/dev/null")
    assert token not in out.stdout and "sleep 30" not in out.stdout, out.stdout


@pytest.fixture()
def host_sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Host processes the sandbox must not be able to signal: as root, uid 1000 and 65534."""
    users = [None, 1000, 65534] if os.geteuid() == 0 else [None]
    procs = [subprocess.Popen(["sleep", "60"], user=uid, group=uid,
                              extra_groups=[] if uid is not None else None)
             for uid in users]
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def test_signals_cannot_reach_the_worker_or_the_host(
    sandbox_run: Run, host_sleepers: list[subprocess.Popen[bytes]]
) -> None:
    sandbox_run("echo kept > state.txt", tid="sig")
    targets = [os.getpid(), os.getppid(), *(p.pid for p in host_sleepers)]
    code = f"""
import os, signal
me = os.getpid()
for pid in sorted(set({targets} + list(range(1, 4096)))):
    if pid == me:
        continue
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except OSError:
            pass
try:
    os.kill(-1, signal.SIGKILL)
except OSError:
    pass
print("SENT", flush=True)
"""
    sandbox_run(py(code), tid="sig", timeout_s=30)
    time.sleep(0.2)
    for proc in host_sleepers:
        assert proc.poll() is None, f"host process (uid {proc.args}) was killed from the sandbox"
    after = sandbox_run("cat state.txt", tid="sig")
    assert after.stdout == "kept\n", "the trajectory's environment did not survive the attack"


def test_ptrace_cannot_cross_the_sandbox(sandbox_run: Run) -> None:
    code = f"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_SEIZE = 0x4206
me, my_uid = os.getpid(), os.getuid()
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
for pid in sorted(set(pids + [{os.getpid()}, {os.getppid()}, 1])):
    if pid == me:
        continue
    if libc.ptrace(PTRACE_SEIZE, pid, None, None) == 0:
        try:
            uid = [l.split()[1] for l in open(f"/proc/{{pid}}/status") if l.startswith("Uid:")][0]
        except (OSError, IndexError):
            uid = "?"
        print("SEIZED", pid, uid, flush=True)
print("MYUID", my_uid, flush=True)
"""
    out = sandbox_run(py(code))
    my_uid = next(line.split()[1] for line in out.stdout.splitlines() if line.startswith("MYUID"))
    seized = [line.split() for line in out.stdout.splitlines() if line.startswith("SEIZED")]
    foreign = [entry for entry in seized if entry[2] != my_uid]
    assert not foreign, f"ptrace reached processes of another uid: {foreign}"
    status = Path(f"/proc/{os.getpid()}/status").read_text()
    assert "TracerPid:\t0" in status


# -- files ------------------------------------------------------------------------------------


def test_huge_file_write_is_capped(sandbox_run: Run) -> None:
    out = sandbox_run("dd if=/dev/zero of=/work/big bs=1M count=200 2>&1; "
                      "dd if=/dev/zero of=/tmp/big bs=1M count=200 2>&1; "
                      "dd if=/dev/zero of=/dev/shm/big bs=1M count=200 2>&1; "
                      "ls -l /work/big /tmp/big /dev/shm/big")
    sizes = {line.split()[-1]: int(line.split()[4]) for line in out.stdout.splitlines()
             if line.startswith("-")}
    assert sizes, out.stdout + out.stderr
    for path, size in sizes.items():
        assert size <= SMALL_LIMITS.file_size_mb * MB, f"{path} grew to {size} bytes"
    assert out.workdir_bytes <= SMALL_LIMITS.file_size_mb * MB + MB


def test_many_files_cannot_fill_the_disk_past_the_workdir_quota(
        sandbox_run: Run, sandbox: SandboxBackend) -> None:
    fill = ("i=0; while [ $i -lt 120 ]; do i=$((i + 1)); "
            "dd if=/dev/zero of=f$i bs=512K count=1 2>&1 | grep -o 'No space left'; done | "
            "sort -u")
    out = sandbox_run(fill, tid="hog", timeout_s=60)
    quota = SMALL_LIMITS.workdir_mb * MB
    if not enforced(sandbox, "workdir"):
        assert out.workdir_exceeded and out.workdir_bytes > quota
        with pytest.raises(WorkdirQuotaError, match="end_trajectory"):
            sandbox_run("true", tid="hog")
        return
    assert "No space left" in out.stdout, "a write past the quota fails while the action runs"
    assert out.workdir_bytes <= quota + MB, f"the work dir grew to {out.workdir_bytes} bytes"


def test_filling_tmp_and_shm_is_capped(sandbox_run: Run) -> None:
    out = sandbox_run("for d in /tmp /dev/shm; do for i in 1 2 3 4; do "
                      "dd if=/dev/zero of=$d/f$i bs=1M count=7 2>/dev/null; done; done; "
                      "du -sk /tmp /dev/shm")
    sizes = [line.split() for line in out.stdout.splitlines()]
    assert len(sizes) == 2, out.stdout + out.stderr
    for kib, path in sizes:
        assert int(kib) <= SMALL_LIMITS.tmp_mb * 1024, f"{path} holds {kib} KiB"
    assert "STILL_OK" in sandbox_run("echo STILL_OK").stdout


def test_etc_shadow_is_unreadable(sandbox_run: Run) -> None:
    secret = ""
    if Path("/etc/shadow").exists():
        lines = Path("/etc/shadow").read_text().splitlines()
        secret = lines[0] if lines else ""
    out = sandbox_run("for f in /etc/shadow /proc/1/root/etc/shadow /work/../etc/shadow "
                      "/etc/gshadow /etc/sudoers; do cat $f 2>/dev/null; done; echo END")
    assert out.stdout == "END\n", f"read a shadow file: {out.stdout!r}"
    if secret:
        assert secret not in out.stdout and secret not in out.stderr


@pytest.fixture()
def host_targets(token: str, sandbox: SandboxBackend) -> Iterator[list[Path]]:
    targets = [Path("/tmp") / token, Path("/var/tmp") / token, REPO / token,
               Path("/root") / token, Path("/usr") / token, Path("/etc") / token]
    for attr in ("root_dir", "instance_dir"):
        if isinstance(getattr(sandbox, attr, None), Path):
            targets.append(getattr(sandbox, attr) / token)
    yield targets
    for target in targets:
        target.unlink(missing_ok=True)


def test_writes_outside_the_work_dir_do_not_reach_the_host(
    sandbox_run: Run, token: str, host_targets: list[Path]
) -> None:
    writes = "; ".join(f"echo PWNED > {t} 2>/dev/null" for t in host_targets)
    sandbox_run(f"{writes}; mkdir -p /host && echo x > /host/{token}; echo done")
    for target in host_targets:
        assert not target.exists(), f"sandbox wrote {target} on the host"


def test_other_trajectories_files_are_out_of_reach(
    sandbox_run: Run, sandbox: SandboxBackend
) -> None:
    sandbox_run("echo SECRET-OF-A > secret.txt", tid="traj-a")
    host_dirs = ""
    instance = getattr(sandbox, "instance_dir", None)
    if isinstance(instance, Path):
        host_dirs = " ".join(f"{p}/secret.txt" for p in instance.iterdir())
    out = sandbox_run(f"cat {host_dirs} ../*/secret.txt /work/../*/secret.txt "
                      "/proc/*/root/work/secret.txt /proc/*/cwd/secret.txt 2>/dev/null; "
                      "find / -name secret.txt 2>/dev/null", tid="traj-b")
    assert "SECRET-OF-A" not in out.stdout


def test_symlink_tricks_do_not_leave_the_work_dir(sandbox_run: Run, token: str) -> None:
    victim = Path("/var/tmp") / f"{token}-victim"
    victim.write_text("original")
    try:
        planted = sandbox_run(f"ln -s {victim} planted && mkdir d && ln -s /var/tmp d/up && "
                              f"ln -s / rootlink && ln /etc/passwd hardlink 2>/dev/null; "
                              f"echo PLANTED", tid="sym")
        assert "PLANTED" in planted.stdout
        sandbox_run("true", tid="sym", files={"planted": "PWNED"})
        for path in (f"d/up/{token}-new", f"rootlink/var/tmp/{token}-new"):
            with pytest.raises(SandboxSpecError, match="not a directory"):
                sandbox_run("true", tid="sym", files={path: "PWNED"})
        check = sandbox_run("test -L planted || echo REGULAR; cat planted", tid="sym")
        assert check.stdout == "REGULAR\nPWNED", check.stdout
        assert victim.read_text() == "original"
        assert not (Path("/var/tmp") / f"{token}-new").exists()
    finally:
        victim.unlink(missing_ok=True)


def test_proc_cannot_be_used_to_escape(sandbox_run: Run, token: str) -> None:
    marker = Path("/var/tmp") / f"{token}-proc-marker"
    marker.write_text(token)
    core_pattern = Path("/proc/sys/kernel/core_pattern").read_text()
    try:
        out = sandbox_run(
            f"for p in /proc/[0-9]* /proc/self /proc/thread-self; do "
            f"cat $p/root/{marker} $p/cwd/../../../{marker} $p/root/../../{marker}; done; "
            f"cat /proc/1/environ; head -c 16 /proc/kcore; head -c 16 /proc/kmem; "
            f"v=$(cat /proc/sys/kernel/core_pattern) && "
            f"printf '%s\\n' \"$v\" > /proc/sys/kernel/core_pattern && echo WROTE core_pattern; "
            f"echo h > /proc/sysrq-trigger && echo WROTE sysrq; "
            f"echo 1 > /proc/sys/vm/drop_caches && echo WROTE drop_caches; "
            f"echo done", timeout_s=30)
    finally:
        marker.unlink(missing_ok=True)
    assert token not in out.stdout, "the sandbox read a host file through /proc"
    assert "WROTE" not in out.stdout, out.stdout
    assert Path("/proc/sys/kernel/core_pattern").read_text() == core_pattern


def test_root_and_dev_are_read_only(sandbox_run: Run) -> None:
    out = sandbox_run("for p in /x /dev/x /etc/x /usr/x /proc/x /sys/x /usr/bin/x; do "
                      "touch $p 2>/dev/null && echo WROTE $p; done; echo done")
    assert "WROTE" not in out.stdout


def test_raw_devices_are_out_of_reach(sandbox_run: Run) -> None:
    out = sandbox_run("for d in /dev/mem /dev/kmem /dev/port /dev/kmsg /dev/vda /dev/sda "
                      "/dev/nvme0n1 /dev/xvda /dev/loop0 /dev/fuse; do "
                      "head -c 1 $d >/dev/null 2>&1 && echo READ $d; done; "
                      "mknod /tmp/mem c 1 1 2>/dev/null && echo MKNOD; "
                      "mknod /work/disk b 8 0 2>/dev/null && echo MKNOD; echo done")
    assert "READ" not in out.stdout and "MKNOD" not in out.stdout, out.stdout


# -- network ----------------------------------------------------------------------------------


@pytest.fixture()
def loopback_listener() -> Iterator[tuple[int, list[str]]]:
    """A TCP listener on all host addresses that records every connection it accepts."""
    server = socket.socket()
    server.bind(("0.0.0.0", 0))
    server.listen()
    server.settimeout(0.2)
    accepted: list[str] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, addr = server.accept()
            except OSError:
                continue
            accepted.append(str(addr))
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join(2)
    server.close()


def _host_addresses() -> list[str]:
    """This machine's IPv4 addresses that are not loopback (may be empty)."""
    found = set()
    with contextlib.suppress(OSError):
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            found.add(str(info[4][0]))
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("10.255.255.255", 1))
        found.add(probe.getsockname()[0])
    return sorted(a for a in found if not a.startswith("127."))


def test_local_redis_and_loopback_services_are_unreachable(
    sandbox_run: Run, loopback_listener: tuple[int, list[str]]
) -> None:
    port, accepted = loopback_listener
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass  # the listener works from the host
    time.sleep(0.3)
    baseline = len(accepted)
    hosts = [("127.0.0.1", 6379), ("127.0.0.1", port), ("localhost", port), ("::1", 6379),
             *((addr, port) for addr in _host_addresses())]
    code = f"""
import socket
for host, port in {hosts}:
    try:
        socket.create_connection((host, port), timeout=2).close()
        print("CONNECTED", host, port)
    except OSError as exc:
        print("refused", host, port, type(exc).__name__)
lines = open("/proc/net/dev").read().splitlines()[2:]
print("IFACES", ",".join(line.split(":")[0].strip() for line in lines))
"""
    out = sandbox_run(py(code), timeout_s=30)
    time.sleep(0.3)
    assert "CONNECTED" not in out.stdout, out.stdout
    assert len(accepted) == baseline, "the sandbox reached a host listener"
    assert "IFACES lo\n" in out.stdout, f"network interfaces visible: {out.stdout}"


def _host_unix_sockets() -> tuple[list[str], list[str]]:
    """(abstract names, filesystem paths) of the host's listening unix sockets (a sample)."""
    abstract, paths = [], []
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 8 and fields[3] == "00010000":  # listening
                name = fields[7]
                (abstract if name.startswith("@") else paths).append(name)
    return sorted(set(abstract))[:40], sorted(set(paths))[:40]


def test_sockets_of_every_family_are_contained(
    sandbox_run: Run, loopback_listener: tuple[int, list[str]]
) -> None:
    abstract, paths = _host_unix_sockets()
    code = f"""
import socket
opened = set()
for family in range(0, 46):
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_RAW, socket.SOCK_SEQPACKET):
        try:
            socket.socket(family, kind).close()
            opened.add(family)
        except OSError:
            pass
print("OPENED", sorted(opened))
for name in {abstract!r} + {paths!r}:
    address = "\\0" + name[1:] if name.startswith("@") else name
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET):
        try:
            with socket.socket(socket.AF_UNIX, kind) as s:
                s.settimeout(1)
                s.connect(address)
                print("REACHED", name)
        except OSError:
            pass
try:
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as s:
        s.bind((0, 0))
    print("NETLINK ok")
except OSError as exc:
    print("NETLINK", exc.errno)
print("DONE")
"""
    out = sandbox_run(py(code), timeout_s=60)
    assert "DONE" in out.stdout, out.stdout + out.stderr
    opened_line = next(line for line in out.stdout.splitlines() if line.startswith("OPENED"))
    opened = {int(f) for f in opened_line[len("OPENED "):].strip("[]").split(",") if f.strip()}
    channels_out = {socket.AF_VSOCK, socket.AF_PACKET, 41}  # vsock, raw packets, AF_KCM
    assert not opened & channels_out, f"socket families that lead out opened: {opened}"
    assert opened <= {socket.AF_UNIX, socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK,
                      38}, f"unexpected socket families opened: {sorted(opened)}"
    assert "REACHED" not in out.stdout, out.stdout


# -- privileges -------------------------------------------------------------------------------


def _host_uids_while_running(run: Run, tid: str, token: str,
                             host_pids_with: Callable[[str], list[int]]) -> set[int]:
    """Start a sleeping action and read, from the host, the real uids of its processes."""
    result: list[ExecOutcome] = []
    thread = threading.Thread(target=lambda: result.append(
        run(f"sh -c 'sleep 0.8; : {token}'; echo DONE", tid=tid)))
    thread.start()
    uids: set[int] = set()
    deadline = time.monotonic() + 5
    while not uids and time.monotonic() < deadline:
        for pid in host_pids_with(token):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            uids |= {int(line.split()[1]) for line in status.splitlines()
                     if line.startswith("Uid:")}
        time.sleep(0.05)
    thread.join(10)
    assert result and "DONE" in result[0].stdout
    return uids


def test_runs_unprivileged_without_capabilities(
    sandbox_run: Run, sandbox: SandboxBackend, token: str,
    host_pids_with: Callable[[str], list[int]],
) -> None:
    uids = _host_uids_while_running(sandbox_run, "priv", token, host_pids_with)
    assert uids and 0 not in uids, f"sandboxed processes run as host uids {uids}"
    if os.geteuid() == 0 and isinstance(sandbox, BwrapBackend):
        assert all(uid in sandbox.uids for uid in uids), uids
    out = sandbox_run("grep -E '^(Cap|NoNewPrivs|Seccomp:)' /proc/self/status")
    caps = dict(line.split(":\t") for line in out.stdout.splitlines() if ":\t" in line)
    for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(caps[name], 16) == 0, f"{name} = {caps[name]}"
    assert caps["NoNewPrivs"] == "1" and caps["Seccomp"] == "2"


def test_privilege_escalation_fails(sandbox_run: Run) -> None:
    out = sandbox_run(
        "timeout 5 su -c 'echo ROOT-VIA-SU' root </dev/null 2>/dev/null; "
        "mount -t tmpfs none /tmp 2>/dev/null && echo MOUNTED; "
        "chroot / true 2>/dev/null && echo CHROOTED; "
        + py("import os\nfor f in (lambda: os.setuid(0), lambda: os.setgid(0), "
             "lambda: os.setgroups([0])):\n    try:\n        f()\n        print('BECAME ROOT')\n"
             "    except OSError:\n        pass\nprint('UID', os.getuid(), os.geteuid())"),
        timeout_s=60)
    assert "ROOT-VIA-SU" not in out.stdout and "BECAME ROOT" not in out.stdout, out.stdout
    assert "MOUNTED" not in out.stdout and "CHROOTED" not in out.stdout, out.stdout
    uid_line = next(line for line in out.stdout.splitlines() if line.startswith("UID"))
    assert "0" not in uid_line.split()[1:], uid_line


def test_environment_secrets_do_not_leak(sandbox_run: Run, token: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANGRAM_TEST_SECRET", token)
    monkeypatch.setenv("TANGRAM_REDIS_URL", f"redis://:{token}@127.0.0.1:6379/0")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", token)
    out = sandbox_run(f"env; for f in /proc/self/environ /proc/1/environ /proc/[0-9]*/environ "
                      f"/proc/{os.getpid()}/environ /proc/{os.getppid()}/environ; do "
                      "tr '\\0' '\\n' < $f; done 2>/dev/null; cat /proc/1/cmdline")
    assert token not in out.stdout and token not in out.stderr
    assert "TANGRAM_UNITS=1" in out.stdout


def test_inherited_file_descriptors_are_closed(sandbox_run: Run, tmp_path: Path) -> None:
    secret = tmp_path / "secret-fd-target"
    secret.write_text("fd secret")
    leaked = os.open(secret, os.O_RDONLY)
    os.set_inheritable(leaked, True)
    sock = socket.socket()
    sock.set_inheritable(True)
    try:
        code = """
import os
print("SELF", sorted(int(f) for f in os.listdir("/proc/self/fd")))
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            print("LINK", pid, fd, os.readlink(f"/proc/{pid}/fd/{fd}"))
    except OSError:
        pass
"""
        out = sandbox_run(py(code))
    finally:
        os.close(leaked)
        sock.close()
    self_fds = next(line for line in out.stdout.splitlines() if line.startswith("SELF"))
    assert self_fds == "SELF [0, 1, 2, 3]", self_fds  # stdio + the listing's own fd
    assert "secret-fd-target" not in out.stdout
    assert "socket:" not in out.stdout


def test_nested_user_namespaces_are_refused(sandbox_run: Run) -> None:
    out = sandbox_run("unshare -U -r id -u && echo NESTED_OK; "
                      + py("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                           "print('UNSHARE', libc.unshare(0x10000000), ctypes.get_errno())"))
    assert "NESTED_OK" not in out.stdout
    assert "UNSHARE -1" in out.stdout


@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("keyctl(get session keyring)", "libc.syscall(250, 0, -3, 0)"),
        ("add_key", "libc.syscall(248, b'user', b'k', b'v', 1, -3)"),
        ("io_uring_setup", "libc.syscall(425, 8, ctypes.create_string_buffer(256))"),
        ("bpf", "libc.syscall(321, 0, None, 0)"),
        ("perf_event_open", "libc.syscall(298, ctypes.create_string_buffer(128), 0, -1, -1, 0)"),
        ("sched_setscheduler(SCHED_FIFO)",
         "libc.syscall(144, 0, 1, ctypes.byref(ctypes.c_int(1)))"),
        ("sched_setattr", "libc.syscall(314, 0, ctypes.create_string_buffer(56), 0)"),
    ],
)
def test_dangerous_syscalls_are_refused(sandbox_run: Run, name: str, call: str) -> None:
    if platform.machine() != "x86_64":
        pytest.skip("syscall numbers in this test are x86_64's")
    code = f"import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nr = {call}\n" \
           f"print('RESULT', r, ctypes.get_errno())"
    out = sandbox_run(py(code))
    assert "RESULT -1 1" in out.stdout, f"{name}: {out.stdout} {out.stderr}"


def test_cpu_pinning_cannot_be_escaped(sandbox_run: Run, sandbox: SandboxBackend,
                                       two_cores: tuple[int, int]) -> None:
    assert enforced(sandbox, "cores")
    first, second = two_cores
    out = sandbox_run(f"taskset -c {first} grep Cpus_allowed_list /proc/self/status; "
                      f"taskset -pc {first},{second} $$; grep Cpus_allowed_list /proc/self/status",
                      cores=(second,))
    lists = [line.split()[-1] for line in out.stdout.splitlines()
             if line.startswith("Cpus_allowed_list")]
    assert lists and all(cpus == str(second) for cpus in lists), out.stdout + out.stderr


def test_an_action_cannot_widen_its_cores(sandbox_run: Run, sandbox: SandboxBackend,
                                         two_cores: tuple[int, int]) -> None:
    """On every mode, with or without a cpuset: the affinity call is refused (seccomp), so an
    action stays on the cores it was given."""
    first, second = two_cores
    code = (f"import os\ntry:\n    os.sched_setaffinity(0, {{{first}, {second}}})\n"
            "    print('WIDENED', flush=True)\nexcept OSError as exc:\n"
            "    print('REFUSED', exc.errno, flush=True)\n"
            "print('ON', sorted(os.sched_getaffinity(0)))")
    out = sandbox_run(py(code), cores=(second,))
    assert "REFUSED 1" in out.stdout, out.stdout + out.stderr
    assert f"ON [{second}]" in out.stdout, out.stdout + out.stderr


# -- output -----------------------------------------------------------------------------------


def test_very_long_output_is_capped(sandbox_run: Run) -> None:
    t0 = time.monotonic()
    out = sandbox_run("head -c 50000000 /dev/zero | tr '\\0' 'y'; "
                      "head -c 1000000 /dev/urandom >&2", timeout_s=60)
    cap = SMALL_LIMITS.output_cap_bytes
    cut = CUT_MARKER.format(cut=50_000_000 - cap)
    assert out.stdout_truncated and out.stdout == "y" * (cap // 2) + cut + "y" * (cap - cap // 2)
    assert out.stderr_truncated and len(out.stderr.encode("utf-8", "surrogatepass")) >= cap
    assert time.monotonic() - t0 < 30


def test_binary_output_is_decoded_safely(sandbox_run: Run) -> None:
    out = sandbox_run(
        "head -c 1500 /dev/urandom; printf '\\000\\377\\376\\036tangram-end 0 0 0 0\\036'; "
        "printf 'tail\\000end'; head -c 1500 /dev/urandom >&2; "
        "printf '\\036tangram-ready\\036\\001\\000\\000\\000\\000\\000\\000\\377' >&2; "
        "printf 'ERR-END' >&2")
    assert out.exit_code == 0 and not out.stdout_truncated and not out.stderr_truncated
    assert out.stdout.endswith("tail\x00end") and "\ufffd" in out.stdout
    assert out.stderr.endswith("ERR-END") and "tangram-ready" in out.stderr
    assert "tangram-end 0 0 0 0" in out.stdout


# -- bubblewrap's own mechanisms ----------------------------------------------------------------


def test_bwrap_trajectories_run_as_distinct_uids(
    run: Run, token: str, host_pids_with: Callable[[str], list[int]]
) -> None:
    a = _host_uids_while_running(run, "uid-a", token + "a", host_pids_with)
    b = _host_uids_while_running(run, "uid-b", token + "b", host_pids_with)
    assert a and b and not (a & b), (a, b)


def test_bwrap_uid_has_no_process_left_after_its_actions(run: Run, backend: BwrapBackend) -> None:
    for _ in range(3):
        run("(sleep 30 &); sh -c 'exit 0' & wait")
    traj = backend._trajs["t1"]
    uid = traj.uid
    assert traj.executor is not None
    sandbox = {str(traj.executor.proc.pid)}  # bubblewrap and the warm executor live on
    sandbox |= set(Path(f"/proc/{traj.executor.proc.pid}/task/{traj.executor.proc.pid}/children")
                   .read_text().split())
    time.sleep(0.2)
    left = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields["Uid"].split()[0]) == uid and pid not in sandbox:
            left.append((pid, fields["Name"].strip(), fields["State"].strip()))
    assert not left, f"processes of the trajectory's uid outlived its actions: {left}"
