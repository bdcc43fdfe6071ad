"""Attacks on the embedded sandbox. Each test FAILS if its attack succeeds.

Every attack is bounded in time and count (timeouts, loop limits) and targets loopback only.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tangram_celery.errors import SandboxSpecError
from tangram_celery.sandbox import ExecOutcome, SandboxLimits, WorkdirQuotaError
from tangram_celery.sandbox.bwrap import BwrapBackend

Run = Callable[..., ExecOutcome]
# the limits the `backend` fixture uses (tests/sandbox/conftest.py)
SMALL_LIMITS = SandboxLimits(
    memory_mb=256, pids=64, file_size_mb=8, workdir_mb=32, tmp_mb=16, nofile=128,
    output_cap_bytes=4096,
)

MB = 1024 * 1024
REPO = Path(__file__).resolve().parents[2]


def py(code: str) -> str:
    """A shell command running ``code`` with the sandbox's system python."""
    return "python3 - <<'PYEOF'\n" + code.strip() + "\nPYEOF\n"


# -- time -------------------------------------------------------------------------------------


def test_infinite_loop_is_killed_at_the_timeout(run: Run, token: str,
                                                assert_gone: Callable[[str], None]) -> None:
    t0 = time.monotonic()
    out = run(f"trap '' TERM INT HUP; exec sh -c 'while :; do :; done' {token}", timeout_s=1.0)
    elapsed = time.monotonic() - t0
    assert out.timed_out and out.exit_code is None and out.signal == 9
    assert elapsed < 4.0, f"timeout of 1 s took {elapsed:.1f} s to enforce"
    assert_gone(token)


def test_timeout_kills_the_whole_tree(run: Run, token: str,
                                      assert_gone: Callable[[str], None]) -> None:
    cmd = f"for i in 1 2 3; do sh -c 'sleep 60; : {token}' & done; sleep 60"
    out = run(cmd, timeout_s=0.5)
    assert out.timed_out
    assert_gone(token)


# -- memory -----------------------------------------------------------------------------------


def test_one_gib_allocation_fails(run: Run) -> None:
    out = run(py("b = bytearray(1 << 30)\nprint('ALLOCATED', flush=True)"))
    assert "ALLOCATED" not in out.stdout
    assert out.exit_code != 0


def test_touching_memory_stops_below_the_limit(run: Run) -> None:
    code = """
chunks = []
for i in range(16):          # up to 1 GiB in 64 MiB chunks, every page touched
    chunks.append(bytearray(b"x" * (64 << 20)))
    print("HELD", (i + 1) * 64, flush=True)
"""
    out = run(py(code), timeout_s=30)
    held = [int(line.split()[1]) for line in out.stdout.splitlines() if line.startswith("HELD")]
    assert out.exit_code != 0
    assert max(held, default=0) <= SMALL_LIMITS.memory_mb, f"held {max(held)} MiB"


def test_memory_is_capped_across_processes(run: Run, backend: BwrapBackend) -> None:
    assert backend.cgroups is not None and "memory" in backend.cgroups.controllers, (
        f"memory cgroup not usable here: {getattr(backend.cgroups, 'unavailable', None)}")
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
    out = run(py(code), timeout_s=30)
    assert "SURVIVORS 3" not in out.stdout, out.stdout
    assert out.oom_killed


# -- processes ----------------------------------------------------------------------------------


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


def test_bounded_fork_bomb_is_capped_and_does_not_starve_others(
    run: Run, token: str, assert_gone: Callable[[str], None]
) -> None:
    results: dict[str, object] = {}

    def bomb() -> None:
        results["bomb"] = run(py(FORK_BOMB) + f"# {token}", tid="bomber", timeout_s=20)

    thread = threading.Thread(target=bomb)
    thread.start()
    time.sleep(1.0)   # the bomb now holds every process it could get
    other = run("for i in $(seq 20); do sleep 0.2 & done; wait; echo NEIGHBOUR_OK",
                tid="neighbour", cores=(0,), timeout_s=20)
    thread.join(30)
    bomb_out = results["bomb"]
    forked = [int(line.split()[1]) for line in bomb_out.stdout.splitlines()  # type: ignore[attr-defined]
              if line.startswith("FORKED")]
    assert forked and forked[0] < SMALL_LIMITS.pids, f"fork bomb got {forked} processes"
    assert "NEIGHBOUR_OK" in other.stdout, other.stderr
    assert_gone(token)


def test_double_forked_setsid_escapee_dies_with_the_action(
    run: Run, token: str, assert_gone: Callable[[str], None]
) -> None:
    cmd = (f"(setsid sh -c 'trap \"\" HUP TERM; sleep 30; : {token}' </dev/null >/dev/null 2>&1 &);"
           f" (nohup sh -c 'sleep 30; : {token}' >/dev/null 2>&1 &); echo LAUNCHED")
    out = run(cmd)
    assert "LAUNCHED" in out.stdout and out.exit_code == 0
    assert_gone(token)


# -- files ------------------------------------------------------------------------------------


def test_huge_file_write_is_capped(run: Run, backend: BwrapBackend) -> None:
    out = run("dd if=/dev/zero of=/work/big bs=1M count=200 2>&1; "
              "dd if=/dev/zero of=/tmp/big bs=1M count=200 2>&1; "
              "dd if=/dev/zero of=/dev/shm/big bs=1M count=200 2>&1; "
              "ls -l /work/big /tmp/big /dev/shm/big")
    sizes = {line.split()[-1]: int(line.split()[4]) for line in out.stdout.splitlines()
             if line.startswith("-")}
    assert sizes, out.stdout + out.stderr
    for path, size in sizes.items():
        assert size <= SMALL_LIMITS.file_size_mb * MB, f"{path} grew to {size} bytes"
    assert out.workdir_bytes <= SMALL_LIMITS.file_size_mb * MB + MB


def test_many_files_over_the_workdir_quota_are_caught(run: Run) -> None:
    out = run("for i in 1 2 3 4 5 6; do dd if=/dev/zero of=f$i bs=1M count=7 2>/dev/null; done",
              tid="hog")
    assert out.workdir_exceeded and out.workdir_bytes > SMALL_LIMITS.workdir_mb * MB
    with pytest.raises(WorkdirQuotaError, match="end_trajectory"):
        run("true", tid="hog")


def test_tmpfs_sizes_are_capped(run: Run) -> None:
    out = run("for d in /tmp /dev/shm; do for i in 1 2 3 4; do "
              "dd if=/dev/zero of=$d/f$i bs=1M count=7 2>/dev/null; done; done; "
              "du -sk /tmp /dev/shm")
    for line in out.stdout.splitlines():
        kib, path = line.split()
        assert int(kib) <= SMALL_LIMITS.tmp_mb * 1024, f"{path} holds {kib} KiB"


def test_etc_shadow_is_unreadable(run: Run) -> None:
    secret = ""
    if Path("/etc/shadow").exists():
        lines = Path("/etc/shadow").read_text().splitlines()
        secret = lines[0] if lines else ""
    out = run("cat /etc/shadow; cat /proc/1/root/etc/shadow; cat /work/../etc/shadow; "
              "cat /etc/gshadow; ls /etc")
    listing = out.stdout.split()
    assert "shadow" not in listing and "gshadow" not in listing
    if secret:
        assert secret not in out.stdout and secret not in out.stderr


@pytest.fixture()
def host_targets(token: str, backend: BwrapBackend) -> Iterator[list[Path]]:
    targets = [Path("/tmp") / token, Path("/var/tmp") / token, REPO / token,
               Path("/root") / token, Path("/usr") / token, Path("/etc") / token,
               backend.root_dir / token, backend.instance_dir / token]
    yield targets
    for target in targets:
        target.unlink(missing_ok=True)


def test_writes_outside_the_work_dir_do_not_reach_the_host(
    run: Run, token: str, host_targets: list[Path], backend: BwrapBackend
) -> None:
    writes = "; ".join(f"echo PWNED > {t} 2>/dev/null" for t in host_targets)
    run(f"{writes}; mkdir -p /host && echo x > /host/{token}; echo done")
    for target in host_targets:
        assert not target.exists(), f"sandbox wrote {target} on the host"


def test_other_trajectories_files_are_out_of_reach(run: Run, backend: BwrapBackend) -> None:
    run("echo SECRET-OF-A > secret.txt", tid="traj-a")
    a_dir = backend.instance_dir / next(p.name for p in backend.instance_dir.iterdir())
    out = run(f"cat {a_dir}/secret.txt ../*/secret.txt /work/../*/secret.txt; "
              "find / -name secret.txt 2>/dev/null", tid="traj-b")
    assert "SECRET-OF-A" not in out.stdout


def test_planted_symlink_does_not_redirect_spec_files(
    run: Run, sandbox_root: Path, token: str
) -> None:
    victim = Path("/var/tmp") / f"{token}-victim"
    victim.write_text("original")
    try:
        run(f"ln -s {victim} planted && mkdir d && ln -s /var/tmp d/up", tid="sym")
        run("true", tid="sym", files={"planted": "PWNED"})
        with pytest.raises(SandboxSpecError, match="not a directory"):
            run("true", tid="sym", files={f"d/up/{token}-new": "PWNED"})
        assert victim.read_text() == "original"
        assert not (Path("/var/tmp") / f"{token}-new").exists()
    finally:
        victim.unlink(missing_ok=True)


# -- network ----------------------------------------------------------------------------------


@pytest.fixture()
def loopback_listener() -> Iterator[tuple[int, list[str]]]:
    """A TCP listener on 127.0.0.1 that records every connection it accepts."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
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


def test_local_redis_and_loopback_services_are_unreachable(
    run: Run, loopback_listener: tuple[int, list[str]]
) -> None:
    port, accepted = loopback_listener
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass  # the listener works from the host
    time.sleep(0.3)
    baseline = len(accepted)
    code = f"""
import socket
for host, port in [("127.0.0.1", 6379), ("127.0.0.1", {port}), ("localhost", {port}),
                   ("::1", 6379)]:
    try:
        socket.create_connection((host, port), timeout=2).close()
        print("CONNECTED", host, port)
    except OSError as exc:
        print("refused", host, port, type(exc).__name__)
lines = open("/proc/net/dev").read().splitlines()[2:]
print("IFACES", ",".join(line.split(":")[0].strip() for line in lines))
"""
    out = run(py(code), timeout_s=30)
    time.sleep(0.3)
    assert "CONNECTED" not in out.stdout, out.stdout
    assert len(accepted) == baseline, "the sandbox reached a host loopback listener"
    assert "IFACES lo\n" in out.stdout, f"network interfaces visible: {out.stdout}"


# -- hardening checklist ----------------------------------------------------------------------


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
    run: Run, backend: BwrapBackend, token: str, host_pids_with: Callable[[str], list[int]]
) -> None:
    uids = _host_uids_while_running(run, "priv", token, host_pids_with)
    assert uids and 0 not in uids, f"sandboxed processes run as host uids {uids}"
    if os.geteuid() == 0:
        assert all(uid in backend.uids for uid in uids), uids
    out = run("grep -E '^(Cap|NoNewPrivs|Seccomp:)' /proc/self/status")
    caps = dict(line.split(":\t") for line in out.stdout.splitlines() if ":\t" in line)
    for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(caps[name], 16) == 0, f"{name} = {caps[name]}"
    assert caps["NoNewPrivs"] == "1" and caps["Seccomp"] == "2"


def test_trajectories_run_as_distinct_uids(
    run: Run, token: str, host_pids_with: Callable[[str], list[int]]
) -> None:
    a = _host_uids_while_running(run, "uid-a", token + "a", host_pids_with)
    b = _host_uids_while_running(run, "uid-b", token + "b", host_pids_with)
    assert a and b and not (a & b), (a, b)


def test_environment_secrets_do_not_leak(run: Run, token: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANGRAM_TEST_SECRET", token)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", token)
    out = run("env; for f in /proc/self/environ /proc/1/environ /proc/[0-9]*/environ; do "
              "tr '\\0' '\\n' < $f; done 2>/dev/null; cat /proc/1/cmdline")
    assert token not in out.stdout and token not in out.stderr
    assert "TANGRAM_UNITS=1" in out.stdout


def test_inherited_file_descriptors_are_closed(run: Run, tmp_path: Path) -> None:
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
        out = run(py(code))
    finally:
        os.close(leaked)
        sock.close()
    self_fds = next(line for line in out.stdout.splitlines() if line.startswith("SELF"))
    assert self_fds == "SELF [0, 1, 2, 3]", self_fds  # stdio + the listing's own fd
    assert "secret-fd-target" not in out.stdout
    assert "socket:" not in out.stdout


def test_nested_user_namespaces_are_refused(run: Run) -> None:
    out = run("unshare -U -r id -u && echo NESTED_OK; "
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
    ],
)
def test_dangerous_syscalls_are_refused(run: Run, name: str, call: str) -> None:
    import platform

    if platform.machine() != "x86_64":
        pytest.skip("syscall numbers in this test are x86_64's")
    code = f"import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nr = {call}\n" \
           f"print('RESULT', r, ctypes.get_errno())"
    out = run(py(code))
    assert "RESULT -1 1" in out.stdout, f"{name}: {out.stdout} {out.stderr}"


def test_vsock_sockets_are_refused(run: Run) -> None:
    out = run(py("import socket\ntry:\n    socket.socket(40, socket.SOCK_STREAM)\n"
                 "    print('VSOCK_OPEN')\nexcept OSError as e:\n    print('ERRNO', e.errno)"))
    assert "VSOCK_OPEN" not in out.stdout and "ERRNO 1" in out.stdout


def test_root_and_dev_are_read_only(run: Run) -> None:
    out = run("for p in /x /dev/x /etc/x /usr/x /proc/x; do "
              "touch $p 2>/dev/null && echo WROTE $p; done; echo done")
    assert "WROTE" not in out.stdout


def test_output_is_capped_and_decoded(run: Run) -> None:
    out = run("head -c 1000000 /dev/zero | tr '\\0' 'y'; head -c 100000 /dev/urandom >&2")
    cap = SMALL_LIMITS.output_cap_bytes
    assert out.stdout_truncated and out.stdout == "y" * cap
    assert out.stderr_truncated and len(out.stderr.encode("utf-8", "surrogatepass")) >= cap


def test_cpu_pinning_cannot_be_escaped(run: Run, backend: BwrapBackend,
                                       two_cores: tuple[int, int]) -> None:
    assert backend.cgroups is not None and "cpuset" in backend.cgroups.controllers, (
        f"cpuset cgroup not usable here: {getattr(backend.cgroups, 'unavailable', None)}")
    first, second = two_cores
    out = run(f"taskset -c {first} grep Cpus_allowed_list /proc/self/status; "
              f"taskset -pc {first},{second} $$; grep Cpus_allowed_list /proc/self/status",
              cores=(second,))
    lists = [line.split()[-1] for line in out.stdout.splitlines()
             if line.startswith("Cpus_allowed_list")]
    assert lists and all(cpus == str(second) for cpus in lists), out.stdout + out.stderr


def test_no_process_or_zombie_of_the_trajectory_outlives_its_actions(
    run: Run, backend: BwrapBackend
) -> None:
    for _ in range(3):
        run("(sleep 30 &); sh -c 'exit 0' & wait")
    uid = backend._trajs["t1"].uid
    time.sleep(0.2)
    left = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields["Uid"].split()[0]) == uid:
            left.append((pid, fields["Name"].strip(), fields["State"].strip()))
    assert not left, f"processes of the trajectory's uid outlived its actions: {left}"
