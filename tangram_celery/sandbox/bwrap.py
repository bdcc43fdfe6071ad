"""The embedded sandbox backend: bubblewrap, started as an unprivileged uid, one per trajectory.

Each action runs in a fresh bubblewrap sandbox (about 10 ms to start): new user, pid, net, ipc,
uts and cgroup namespaces (no network at all, loopback included), nested user namespaces refused,
no capabilities, a read-only root with read-only ``/usr`` and a short allow-list of ``/etc``,
sized tmpfs ``/tmp`` and ``/dev/shm``, a clean environment, a seccomp deny-list, and the
trajectory's work dir bound read-write at ``/work``. The work dir lives on the host under the
backend's root and persists between the trajectory's actions.

The launch chain, all exec'd in one child process started with ``env -i`` semantics, all fds
closed and the trajectory's own uid (the worker itself runs as root)::

    sh (joins the action's cgroups) -> prlimit (rlimits) -> [taskset] -> bwrap -> sh -> COMMAND

Each live trajectory gets its own host uid from a pool (``uid_base .. uid_base+uid_count-1``), so
RLIMIT_NPROC and file ownership never mix trajectories. Per action, a cgroup v1 group per writable
controller caps memory and pids and pins the cpuset to the allocated cores (CPU affinity via
``taskset`` where cpuset is not writable). The wall-clock timeout SIGKILLs bubblewrap, whose death
takes down the sandbox's pid namespace (``--die-with-parent``), and then every pid left in the
cgroups. :meth:`BwrapBackend.repin` moves a running action onto other cores (its cpuset), which
is how a node lends a core of a running action to a short one (core loans,
:mod:`tangram_celery.scheduling.loans`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import shutil
import signal
import stat
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tangram_celery.errors import (
    SandboxCapacityError,
    SandboxError,
    SandboxSetupError,
    WorkdirQuotaError,
)
from tangram_celery.sandbox.base import MB, ExecOutcome, ExecSpec, SandboxLimits
from tangram_celery.sandbox.cgroup import ActionCgroup, CgroupLimits, CgroupV1, format_cpus
from tangram_celery.sandbox.output import CappedBuffer, ReadyMarker, Sink, pump
from tangram_celery.sandbox.owner import is_stale_tag, owner_tag
from tangram_celery.sandbox.seccomp import build_filter
from tangram_celery.sandbox.validation import sandbox_env, validate_spec, validate_trajectory_id
from tangram_celery.sandbox.workdir import dir_usage, workdir_name, write_files

INSIDE_UID = 1000
INSIDE_WORKDIR = "/work"
READY_MARKER = b"\x1etangram-sandbox-ready\x1e"
SETUP_HELP = "run the README's setup command (it installs bubblewrap and util-linux)"
INSTANCE_PREFIX = "inst-"
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
ETC_ALLOWLIST = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "localtime", "timezone",
    "alternatives", "python3", "python3.11", "protocols", "services", "mime.types",
    "os-release", "debian_version", "gai.conf", "host.conf", "ssl/certs", "ssl/openssl.cnf",
)
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": INSIDE_WORKDIR,
    "USER": "sandbox",
    "LOGNAME": "sandbox",
    "TMPDIR": "/tmp",  # nosec B108 # inside the sandbox: its private tmpfs
    "LANG": "C.UTF-8",
}
PASSWD = (
    "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
    f"sandbox:x:{INSIDE_UID}:{INSIDE_UID}:tangram sandbox:{INSIDE_WORKDIR}:/bin/sh\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
)
GROUP = f"root:x:0:\nsandbox:x:{INSIDE_UID}:\nnogroup:x:65534:\n"
HOSTS = "127.0.0.1\tlocalhost tangram\n::1\tlocalhost ip6-localhost ip6-loopback\n"
ETC_FILES = {"/etc/passwd": PASSWD, "/etc/group": GROUP, "/etc/hosts": HOSTS}
# Joins the cgroups whose procs files are given ($1 = how many), then execs the rest.
JOIN_SCRIPT = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do '
    'printf "%s\\n" "$$" > "$1" || { echo "tangram: cannot join cgroup $1" >&2; exit 125; }; '
    "shift; n=$((n - 1)); done; exec \"$@\""
)
# Inside the sandbox, as its pid 1 (``--as-pid-1``): announce the start on stderr, then run
# `/bin/sh -c COMMAND` as a child. This shell reaps orphans while it waits and its exit takes the
# pid namespace down; being bubblewrap's direct child, it never lingers as a zombie on the host
# (bubblewrap's own pid-1 reaper would be orphaned to the host's init when the action ends).
WRAP_SCRIPT = "printf '\\036tangram-sandbox-ready\\036' >&2; /bin/sh -c \"$1\""


@dataclass
class _Pin:
    """A running action's cores (as the cpuset holds them now) and its cgroups."""

    cores: tuple[int, ...]
    group: ActionCgroup


@dataclass
class _Trajectory:
    """A live trajectory: its uid, work dir and the processes and pins of its running
    actions."""

    trajectory_id: str
    uid: int
    path: Path
    procs: set[subprocess.Popen[bytes]] = field(default_factory=set)
    pins: list[_Pin] = field(default_factory=list)
    active: int = 0
    ended: bool = False
    exceeded: bool = False
    released: bool = False


def _find_tool(name: str, what: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SandboxSetupError(f"{what} ({name!r}) not found on PATH; {SETUP_HELP}")
    return path


def _data_fd(content: bytes) -> int:
    """A pipe's read end that yields ``content`` (under 64 KiB) then EOF, for bubblewrap."""
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, content)
    finally:
        os.close(write_fd)
    return read_fd


def _system_binds() -> list[str]:
    """Read-only binds (or symlinks, on merged-/usr systems) of the system directories."""
    args: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for name in ETC_ALLOWLIST:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return args


def _proc_uid(pid_dir: str) -> int | None:
    try:
        with open(f"/proc/{pid_dir}/status") as fh:
            for line in fh:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _check_uid_range(uid_base: int, uid_count: int) -> None:
    """The sandbox uid range must be unused: its processes are killed when trajectories end."""
    if uid_base < 1 or uid_count < 1 or uid_base + uid_count > 2**31:
        raise SandboxSetupError("uid_base/uid_count must describe non-root uids below 2**31")
    taken = sorted(
        f"{entry.pw_name}={entry.pw_uid}" for entry in pwd.getpwall()
        if uid_base <= entry.pw_uid < uid_base + uid_count
    )
    if taken:
        raise SandboxSetupError(
            f"sandbox uids {uid_base}..{uid_base + uid_count - 1} include host accounts "
            f"({', '.join(taken[:5])}); every process of a trajectory's uid is killed when it "
            "ends, so pick a range no account uses (default uid_base=1500000)"
        )


def _check_traversable(path: Path) -> None:
    """Sandbox uids must be able to reach their work dirs: every parent needs ``o+x``."""
    blocked = [
        str(p) for p in (path, *path.parents)
        if not os.stat(p).st_mode & stat.S_IXOTH
    ]
    if blocked:
        shutil.rmtree(path, ignore_errors=True)
        raise SandboxSetupError(
            f"sandbox uids cannot reach {path}: {', '.join(blocked)} lack the o+x permission; "
            "use a root such as /var/tmp/tangram-sandboxes or run chmod o+x on them"
        )


def kill_uid(uid: int, passes: int = 5) -> int:
    """SIGKILL every host process whose real uid is ``uid``; returns how many were signalled."""
    killed = 0
    for _ in range(passes):
        victims = [int(p) for p in os.listdir("/proc") if p.isdigit() and _proc_uid(p) == uid]
        if not victims:
            break
        for pid in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        time.sleep(0.01)
    return killed


class UidPool:
    """Sandbox uids for live trajectories, exclusive across every backend on this host.

    A uid is taken by holding an ``flock`` on ``<lock_dir>/<uid>``, so two workers whose ranges
    overlap never hand out the same uid (which would let one kill the other's processes when a
    trajectory ends). Freed uids are reused first. Not thread-safe: the backend holds its lock.
    """

    def __init__(self, base: int, count: int, lock_dir: Path) -> None:
        _check_uid_range(base, count)
        self.base, self.count = base, count
        self.lock_dir = lock_dir
        self._free: list[int] = []
        self._elsewhere: list[int] = []
        self._next = base
        self._locks: dict[int, int] = {}

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, int) and self.base <= uid < self.base + self.count

    def take(self) -> int:
        """A uid no other live trajectory on this host holds."""
        while self._free:
            uid = self._free.pop()
            if self._lock(uid):
                return uid
            self._elsewhere.append(uid)
        while self._next < self.base + self.count:
            uid, self._next = self._next, self._next + 1
            if self._lock(uid):
                return uid
            self._elsewhere.append(uid)
        for uid in list(self._elsewhere):  # held by another worker earlier: free by now?
            if self._lock(uid):
                self._elsewhere.remove(uid)
                return uid
        raise SandboxCapacityError(
            f"all {self.count} sandbox uids from {self.base} are held by live trajectories; "
            "end finished trajectories or raise uid_count"
        )

    def give_back(self, uid: int) -> None:
        """Release a uid taken with :meth:`take`."""
        fd = self._locks.pop(uid, None)
        if fd is not None:
            os.close(fd)
            self._free.append(uid)

    def _lock(self, uid: int) -> bool:
        try:
            self.lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.lock_dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise SandboxSetupError(
                f"cannot use the uid lock dir {self.lock_dir}: {exc.strerror}"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._locks[uid] = fd
        return True


class BwrapBackend:
    """The embedded sandbox backend (see the module docstring). Thread-safe."""

    name = "bwrap"

    def __init__(
        self,
        root_dir: Path,
        limits: SandboxLimits,
        *,
        bwrap_path: str = "bwrap",
        uid_base: int = 1_500_000,
        uid_count: int = 65_536,
        uid_lock_dir: Path = Path("/run/tangram-sandbox-uids"),
        cgroups: bool = True,
        seccomp: bool = True,
    ) -> None:
        """Prepare the backend; runs nothing yet.

        ``root_dir`` holds the work dirs (in an ``inst-*`` sub-directory removed by
        :meth:`close`); it and its parents must be traversable (``o+x``) since bubblewrap runs
        as the sandbox uid. Each work dir is private to its trajectory's uid (mode 0700). When
        the worker runs as root, each trajectory runs as its own uid from ``uid_base`` to
        ``uid_base + uid_count - 1`` (pick a range no other user or worker on the host uses);
        otherwise everything runs as the worker's own uid. A uid is held through a lock file
        in ``uid_lock_dir`` so workers with overlapping ranges never share one.
        ``cgroups=False`` and ``seccomp=False`` turn those layers off.
        """
        self.limits = limits
        self._bwrap = _find_tool(bwrap_path, "bubblewrap")
        self._prlimit = _find_tool("prlimit", "prlimit (util-linux)")
        self._taskset = _find_tool("taskset", "taskset (util-linux)")
        self._sh = "/bin/sh"
        self._privileged = os.geteuid() == 0
        self.uids = UidPool(uid_base, uid_count, uid_lock_dir)
        self._lock = threading.Lock()
        self._trajs: dict[str, _Trajectory] = {}
        self._closed = False
        self.available_cores = frozenset(os.sched_getaffinity(0))
        self._system_binds = _system_binds()
        self._seccomp = build_filter() if seccomp else None
        self.root_dir = Path(root_dir)
        self.instance_dir = self._make_instance_dir()
        self.cgroups = CgroupV1() if cgroups and self._privileged else None

    # -- public interface -------------------------------------------------------------------

    def run(self, spec: ExecSpec) -> ExecOutcome:
        """Run ``spec`` in its trajectory's sandbox (creating the trajectory on first use)."""
        t0 = time.monotonic()
        files = validate_spec(spec, self.limits, self.available_cores)
        traj = self._enter(spec.trajectory_id)
        try:
            try:
                write_files(traj.path, files, traj.uid, traj.uid)
            except FileNotFoundError as exc:
                raise self._ended_error(traj) from exc
            return self._execute(spec, traj, t0)
        finally:
            self._leave(traj)

    def repin(self, trajectory_id: str, cores: tuple[int, ...], new_cores: tuple[int, ...]
              ) -> bool:
        """Move the running action of ``trajectory_id`` pinned to ``cores`` onto ``new_cores``
        (its cgroup cpuset: its processes leave the other cores at once). False, changing
        nothing, when no such action holds a cpuset group (not started yet, finished, or no
        writable cpuset controller) or the cores are not this worker's: the caller must then
        not lend those cores."""
        want, to = _core_set(cores), _core_set(new_cores)
        if not to or not set(to) <= self.available_cores:
            return False
        with self._lock:
            traj = self._trajs.get(trajectory_id)
            pin = next((p for p in traj.pins if p.cores == want), None) if traj else None
            if pin is None:
                return False
            try:
                if not pin.group.set_cpus(to):
                    return False
            except OSError:
                return False
            pin.cores = to
            return True

    def end_trajectory(self, trajectory_id: str) -> None:
        """Kill the trajectory's running actions and remove its work dir; idempotent."""
        with self._lock:
            traj = self._trajs.pop(trajectory_id, None)
            if traj is None:
                return
            traj.ended = True
            procs = list(traj.procs)
        for proc in procs:
            self._kill_proc(proc)
        self._dispose(traj)

    def trajectories(self) -> list[str]:
        """The ids of the trajectories that hold a work dir now."""
        with self._lock:
            return sorted(self._trajs)

    def close(self) -> None:
        """End every trajectory, remove the cgroups and the instance dir; idempotent."""
        with self._lock:
            self._closed = True
            ids = list(self._trajs)
        for trajectory_id in ids:
            self.end_trajectory(trajectory_id)
        if self.cgroups is not None:
            self.cgroups.close()
        shutil.rmtree(self.instance_dir, ignore_errors=True)

    def __enter__(self) -> BwrapBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- trajectories -----------------------------------------------------------------------

    def _make_instance_dir(self) -> Path:
        try:
            self.root_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
            for entry in self.root_dir.iterdir():
                if is_stale_tag(entry.name, INSTANCE_PREFIX):
                    shutil.rmtree(entry, ignore_errors=True)
            path = self.root_dir / owner_tag(INSTANCE_PREFIX)
            path.mkdir()
            path.chmod(0o711)
        except OSError as exc:
            raise SandboxSetupError(
                f"cannot create the sandbox root {self.root_dir}: {exc.strerror}; "
                "point the backend at a writable directory"
            ) from exc
        if self._privileged:
            _check_traversable(path)
        return path

    def _alloc_uid(self) -> int:
        return self.uids.take() if self._privileged else os.getuid()

    def _enter(self, trajectory_id: str) -> _Trajectory:
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox backend is closed; create a new one")
            traj = self._trajs.get(trajectory_id)
            if traj is None:
                traj = self._create(trajectory_id)
            if traj.exceeded:
                raise WorkdirQuotaError(
                    f"trajectory {trajectory_id!r}: its work dir grew past the "
                    f"{self.limits.workdir_mb} MiB quota; end_trajectory() it and start over"
                )
            traj.active += 1
            return traj

    def _create(self, trajectory_id: str) -> _Trajectory:
        uid = self._alloc_uid()
        path = self.instance_dir / workdir_name(validate_trajectory_id(trajectory_id))
        try:
            if path.exists():
                shutil.rmtree(path)
            path.mkdir(mode=0o700)
            os.chown(path, uid, uid)
        except OSError as exc:
            self._release_uid(uid)
            raise SandboxSetupError(f"cannot create a work dir in {self.instance_dir}: "
                                    f"{exc.strerror}") from exc
        traj = _Trajectory(trajectory_id, uid, path)
        self._trajs[trajectory_id] = traj
        return traj

    def _leave(self, traj: _Trajectory) -> None:
        with self._lock:
            traj.active -= 1
            release = traj.ended and traj.active == 0
        if release:
            self._release_uid_when_clean(traj)

    def _dispose(self, traj: _Trajectory) -> None:
        """Remove an ended trajectory's dir; give its uid back once no action is running."""
        shutil.rmtree(traj.path, ignore_errors=True)
        with self._lock:
            idle = traj.active == 0
        if idle:
            self._release_uid_when_clean(traj)

    def _release_uid_when_clean(self, traj: _Trajectory) -> None:
        if not self._privileged:
            return
        with self._lock:
            if traj.released:
                return
            traj.released = True
        kill_uid(traj.uid)
        for leftover in (f"/tmp/.bubblewrap-{traj.uid}", f"/run/user/{traj.uid}/.bubblewrap"):  # nosec B108 # bwrap's own per-uid dir, removed after the uid is killed
            with contextlib.suppress(OSError):
                os.rmdir(leftover)
        with self._lock:
            self._release_uid(traj.uid)

    def _release_uid(self, uid: int) -> None:
        if self._privileged:
            self.uids.give_back(uid)

    @staticmethod
    def _ended_error(traj: _Trajectory) -> SandboxError:
        return SandboxError(f"trajectory {traj.trajectory_id!r} was ended while its action ran")

    # -- one action -------------------------------------------------------------------------

    def _execute(self, spec: ExecSpec, traj: _Trajectory, t0: float) -> ExecOutcome:
        group = self._make_cgroup(spec, traj)
        pin = None if group is None else _Pin(_core_set(spec.cores), group)
        if pin is not None:
            with self._lock:
                traj.pins.append(pin)
        try:
            return self._spawn_and_wait(spec, traj, group, t0)
        finally:
            if pin is not None:
                with self._lock:
                    traj.pins.remove(pin)
            if group is not None:
                group.remove()

    def _make_cgroup(self, spec: ExecSpec, traj: _Trajectory) -> ActionCgroup | None:
        if self.cgroups is None:
            return None
        limits = CgroupLimits(self.limits.memory_mb * MB, self.limits.pids, spec.cores)
        try:
            return self.cgroups.create(limits, traj.uid, traj.uid)
        except OSError as exc:
            raise SandboxSetupError(f"cannot create the action's cgroups: {exc}") from exc

    def _spawn_and_wait(
        self, spec: ExecSpec, traj: _Trajectory, group: ActionCgroup | None, t0: float
    ) -> ExecOutcome:
        stdout = CappedBuffer(self.limits.output_cap_bytes)
        stderr = CappedBuffer(self.limits.output_cap_bytes)
        marker = ReadyMarker(READY_MARKER, stderr)
        stdin_data = spec.stdin.encode("utf-8", "surrogateescape") if spec.stdin else None
        started_at = time.time()
        proc = self._spawn(spec, traj, group, stdin_wanted=stdin_data is not None)
        try:
            finished, returncode = self._wait(proc, group, {1: stdout, 2: marker},
                                              stdin_data, spec.timeout_s)
        finally:
            self._forget(traj, proc)
        end, finished_at = time.monotonic(), time.time()
        if marker.ready_at is None and finished and returncode >= 0 and not traj.ended:
            detail = (bytes(marker.preamble) + bytes(stderr.data)).decode(errors="replace")
            raise SandboxSetupError(
                f"bubblewrap could not start the sandbox (exit {returncode}): {detail.strip()}"
            )
        ready = marker.ready_at if marker.ready_at is not None else end
        usage, exceeded = self._check_workdir(traj)
        exit_code, sig = _status(returncode, timed_out=not finished)
        return ExecOutcome(
            exit_code=exit_code, signal=sig, timed_out=not finished,
            oom_killed=group.oom_killed() if group is not None else False,
            stdout=stdout.text(), stderr=stderr.text(),
            stdout_truncated=stdout.truncated, stderr_truncated=stderr.truncated,
            started_at=started_at, finished_at=finished_at,
            setup_s=max(ready - t0, 0.0), exec_s=max(end - ready, 0.0),
            workdir_bytes=usage, workdir_exceeded=exceeded,
        )

    def _wait(
        self,
        proc: subprocess.Popen[bytes],
        group: ActionCgroup | None,
        sinks: dict[int, Sink],
        stdin_data: bytes | None,
        timeout_s: float,
    ) -> tuple[bool, int]:
        """Pump the streams until exit or timeout (then kill the tree); (finished, returncode)."""
        try:
            finished = pump(proc, sinks, stdin_data, time.monotonic() + timeout_s)
            if not finished:
                self._kill_proc(proc, group)
                pump(proc, sinks, None, time.monotonic() + 2.0)
            return finished, self._reap(proc, group)
        except BaseException:
            self._kill_proc(proc, group)
            proc.wait()
            raise

    def _spawn(
        self, spec: ExecSpec, traj: _Trajectory, group: ActionCgroup | None, *, stdin_wanted: bool
    ) -> subprocess.Popen[bytes]:
        fds: list[int] = []
        try:
            argv = self._argv(spec, traj, group, fds)
            uid = traj.uid if self._privileged else None
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if stdin_wanted else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd="/",
                env={},
                close_fds=True,
                pass_fds=tuple(fds),
                start_new_session=True,
                umask=0o022,
                user=uid,
                group=uid,
                extra_groups=[] if uid is not None else None,
            )
        except OSError as exc:
            raise SandboxSetupError(f"cannot launch bubblewrap: {exc}") from exc
        finally:
            for fd in fds:
                os.close(fd)
        with self._lock:
            traj.procs.add(proc)
            ended = traj.ended
        if ended:
            self._kill_proc(proc, group)
        return proc

    def _argv(
        self, spec: ExecSpec, traj: _Trajectory, group: ActionCgroup | None, fds: list[int]
    ) -> list[str]:
        """The whole launch chain; ``fds`` collects the descriptors bubblewrap must inherit."""
        chain: list[str] = []
        if group is not None:
            procs = [str(p) for p in group.procs_files()]
            chain += [self._sh, "-c", JOIN_SCRIPT, "tangram-join", str(len(procs)), *procs]
        chain += [self._prlimit, *self._rlimit_args(), "--"]
        if group is None or "cpuset" not in group.paths:
            chain += [self._taskset, "-c", format_cpus(spec.cores)]
        return chain + self._bwrap_args(spec, traj, fds)

    def _rlimit_args(self) -> list[str]:
        lim = self.limits
        args = [
            f"--as={lim.effective_address_space_mb * MB}",
            f"--data={lim.memory_mb * MB}",
            f"--nproc={lim.pids}",
            f"--fsize={lim.file_size_mb * MB}",
            f"--nofile={lim.nofile}",
            "--core=0",
        ]
        if lim.cpu_time_s is not None:
            args.append(f"--cpu={lim.cpu_time_s}")
        return args

    def _bwrap_args(self, spec: ExecSpec, traj: _Trajectory, fds: list[int]) -> list[str]:
        def fd_of(fd: int) -> str:
            fds.append(fd)
            return str(fd)

        tmp_bytes = str(self.limits.tmp_mb * MB)
        args = [
            self._bwrap,
            "--unshare-all", "--unshare-user", "--disable-userns",
            "--die-with-parent", "--as-pid-1", "--new-session", "--cap-drop", "ALL", "--clearenv",
            "--uid", str(INSIDE_UID), "--gid", str(INSIDE_UID), "--hostname", "tangram",
            *self._system_binds,
            "--proc", "/proc", "--dev", "/dev",
            "--size", tmp_bytes, "--tmpfs", "/tmp",  # nosec B108 # the sandbox's private tmpfs
            "--size", tmp_bytes, "--tmpfs", "/dev/shm",  # nosec B108 # the sandbox's private tmpfs
            "--bind", str(traj.path), INSIDE_WORKDIR,
            "--chdir", INSIDE_WORKDIR,
        ]
        for dest, content in ETC_FILES.items():
            args += ["--perms", "0444", "--ro-bind-data", fd_of(_data_fd(content.encode())), dest]
        for key, value in sandbox_env(spec, BASE_ENV).items():
            args += ["--setenv", key, value]
        args += ["--remount-ro", "/dev", "--remount-ro", "/"]
        if self._seccomp is not None:
            args += ["--seccomp", fd_of(_data_fd(self._seccomp))]
        return [*args, "--", self._sh, "-c", WRAP_SCRIPT, "tangram", spec.command]

    # -- teardown ---------------------------------------------------------------------------

    def _kill_proc(
        self, proc: subprocess.Popen[bytes], group: ActionCgroup | None = None
    ) -> None:
        """SIGKILL bubblewrap (its sandbox dies with it) and whatever is left in the cgroups."""
        if proc.poll() is None:  # not reaped yet, so its pid (and process group) is still ours
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        if group is not None:
            group.kill()

    def _reap(self, proc: subprocess.Popen[bytes], group: ActionCgroup | None) -> int:
        try:
            return proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self._kill_proc(proc, group)
            return proc.wait()

    def _forget(self, traj: _Trajectory, proc: subprocess.Popen[bytes]) -> None:
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        with self._lock:
            traj.procs.discard(proc)

    def _check_workdir(self, traj: _Trajectory) -> tuple[int, bool]:
        quota = self.limits.workdir_mb * MB
        usage = dir_usage(traj.path, stop_above=quota)
        exceeded = usage > quota
        if exceeded:
            with self._lock:
                traj.exceeded = True
        return usage, exceeded


def _core_set(cores: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sorted(set(cores)))


def _status(returncode: int, *, timed_out: bool) -> tuple[int | None, int | None]:
    """(exit_code, signal) from bubblewrap's status (it reports ``128 + n`` for signal ``n``)."""
    if timed_out:
        return None, int(signal.SIGKILL)
    if returncode < 0:
        return None, -returncode
    if 128 < returncode <= 128 + 64:
        return returncode, returncode - 128
    return returncode, None
