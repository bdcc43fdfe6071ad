"""The embedded sandbox backend: its public face and its trajectories' life cycle.

A trajectory gets a uid from the pool, a private work dir and a warm executor on its first action
(from a ready sandbox when one is started, :mod:`~tangram_celery.sandbox.bwrap.ready`); all go
when it ends. Each action runs through the
:class:`~tangram_celery.sandbox.bwrap.action.ActionRunner`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from tangram_celery.errors import SandboxError, SandboxSetupError, WorkdirQuotaError
from tangram_celery.sandbox.base import MB, ExecOutcome, ExecSpec, SandboxLimits
from tangram_celery.sandbox.bwrap.action import ActionRunner, core_set, kill_proc
from tangram_celery.sandbox.bwrap.enforcement import bwrap_isolation
from tangram_celery.sandbox.bwrap.homes import Homes, unmount_below
from tangram_celery.sandbox.bwrap.housing import house, unhouse
from tangram_celery.sandbox.bwrap.launch import LaunchChain, find_tool, system_binds
from tangram_celery.sandbox.bwrap.ready import READY_PREFIX, ReadyPool
from tangram_celery.sandbox.bwrap.recycle import RecyclePool, wiped
from tangram_celery.sandbox.bwrap.trajectory import Trajectory
from tangram_celery.sandbox.bwrap.warm import WarmExecutor
from tangram_celery.sandbox.cgroups import open_cgroups
from tangram_celery.sandbox.isolation import STRICT, check_mode, require
from tangram_celery.sandbox.owner import is_stale_tag, owner_tag
from tangram_celery.sandbox.seccomp import build_filter
from tangram_celery.sandbox.uids import UidPool, kill_uid
from tangram_celery.sandbox.validation import validate_spec, validate_trajectory_id
from tangram_celery.sandbox.workdir import workdir_name, write_files

INSTANCE_PREFIX = "inst-"
ENDED_PREFIX = "ended-"
RECYCLED_PREFIX = "recycled-"


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


class BwrapBackend:
    """The embedded sandbox backend (see :mod:`tangram_celery.sandbox.bwrap`). Thread-safe."""

    name = "bwrap"
    repins = True

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
        ready: int = 2,
        recycle: int = 8,
        enforce: str = STRICT,
        workdir_tmpfs: bool = True,
    ) -> None:
        """Prepare the backend; runs nothing yet.

        ``root_dir`` holds the work dirs (in an ``inst-*`` sub-directory removed by
        :meth:`close`); it and its parents must be traversable (``o+x``) since bubblewrap runs
        as the sandbox uid. Each work dir is private to its trajectory's uid (mode 0700). When
        the worker runs as root, each trajectory runs as its own uid from ``uid_base`` to
        ``uid_base + uid_count - 1`` (pick a range no other user or worker on the host uses);
        otherwise everything runs as the worker's own uid. A uid is held through a lock file
        in ``uid_lock_dir`` so workers with overlapping ranges never share one.
        ``cgroups=False``, ``seccomp=False`` and ``workdir_tmpfs=False`` turn those layers off.
        ``ready`` sandboxes are kept started ahead (each with its uid, work dir and warm
        executor) for the first actions of new trajectories; 0 starts each on its first action.
        ``recycle`` wiped sandboxes are kept for one-request trajectories (:meth:`lease`).
        ``enforce`` is ``"strict"`` (raise :class:`SandboxSetupError`, naming what is missing,
        when cores or memory cannot be enforced here) or ``"best-effort"`` (run anyway; what is
        not enforced is in :attr:`isolation`).
        """
        self.limits = limits
        bwrap = find_tool(bwrap_path, "bubblewrap")
        prlimit = find_tool("prlimit", "prlimit (util-linux)")
        self._privileged = os.geteuid() == 0
        self.uids = UidPool(uid_base, uid_count, uid_lock_dir)
        self._lock = threading.Lock()
        self._trajs: dict[str, Trajectory] = {}
        self._closed = False
        self.available_cores = frozenset(os.sched_getaffinity(0))
        self.launch = LaunchChain(limits, bwrap, prlimit, system_binds(),
                                  build_filter() if seccomp else None)
        self.root_dir = Path(root_dir)
        self.instance_dir = self._make_instance_dir()
        self.homes = Homes(self.instance_dir, limits.workdir_mb,
                           workdir_tmpfs and self._privileged)
        self.cgroups = open_cgroups() if cgroups else None
        self.isolation = bwrap_isolation(check_mode(enforce), self.cgroups, seccomp, self.homes)
        try:
            require(self.isolation)
        except SandboxSetupError:
            self._abandon()
            raise
        memory_mb = limits.memory_mb + (limits.workdir_mb if self.homes.tmpfs else 0)
        self._runner = ActionRunner(limits, self.cgroups, self._lock, self._start_executor,
                                    memory_mb * MB)
        self._made = 0
        self._ended = itertools.count(1)
        self._ready = ReadyPool(ready, self._make_ready, self._discard_ready)
        self.recycled = RecyclePool(recycle, wiped, self._discard_ready)

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
            return self._runner.execute(spec, traj, t0)
        finally:
            self._leave(traj)

    @contextlib.contextmanager
    def lease(self, trajectory_id: str) -> Iterator[None]:
        """Run a one-request trajectory's actions (:meth:`run` with its id, inside the block)
        in a recycled sandbox, wiped when the block ends and kept for the next one (see
        :mod:`~tangram_celery.sandbox.bwrap.recycle`); a fresh one when none is idle."""
        validate_trajectory_id(trajectory_id)
        traj = self.recycled.take()
        with self._lock:
            if self._closed or trajectory_id in self._trajs:
                if traj is not None:
                    self.recycled.give_back(traj)
                raise SandboxError(f"cannot lease a sandbox to {trajectory_id!r}: "
                                   + ("the backend is closed" if self._closed else
                                      "a trajectory of that id is live; use a new id"))
            if traj is None:
                self._made += 1
                home = self.instance_dir / f"{RECYCLED_PREFIX}{self._made}"
                traj = self._ready.take(home, trajectory_id) or \
                    self._new_sandbox(trajectory_id, home)
            traj.trajectory_id = trajectory_id
            self._trajs[trajectory_id] = traj
        try:
            yield
        finally:
            with self._lock:
                if self._trajs.get(trajectory_id) is traj:
                    del self._trajs[trajectory_id]
            self.recycled.give_back(traj)

    def repin(self, trajectory_id: str, cores: tuple[int, ...], new_cores: tuple[int, ...]
              ) -> bool:
        """Move the running action of ``trajectory_id`` pinned to ``cores`` onto ``new_cores``
        (its cgroup cpuset: it leaves the other cores at once). False, changing nothing, when
        no such action holds a cpuset group (not started yet, finished, no writable cpuset
        controller) or the cores are not this worker's: then do not lend those cores."""
        want, to = core_set(cores), core_set(new_cores)
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

    def host_workdir(self, trajectory_id: str) -> Path | None:
        """The trajectory's work dir on the host, the sandbox's /work (None: it holds none)."""
        with self._lock:
            return self._trajs[trajectory_id].path if trajectory_id in self._trajs else None

    def end_trajectory(self, trajectory_id: str) -> None:
        """Kill the trajectory's running actions and remove its work dir; idempotent."""
        with self._lock:
            traj = self._trajs.pop(trajectory_id, None)
            if traj is None:
                return
            traj.ended = True
            self._set_aside(traj)
            procs = list(traj.procs)
            executor = traj.executor
        if executor is not None:
            executor.close()
        for proc in procs:
            kill_proc(proc)
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
        self._ready.close()
        self.recycled.close()
        for trajectory_id in ids:
            self.end_trajectory(trajectory_id)
        if self.cgroups is not None:
            self.cgroups.close()
        unmount_below(self.instance_dir)
        shutil.rmtree(self.instance_dir, ignore_errors=True)

    def _abandon(self) -> None:
        """Undo what a backend that refused to start had made."""
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
                    unmount_below(entry)
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

    def _start_executor(self, traj: Trajectory) -> WarmExecutor:
        """Start the trajectory's sandbox around a fresh warm executor, in its own cgroups."""
        executor = WarmExecutor.start(lambda channel_fd: self._spawn_sandbox(traj, channel_fd))
        house(self.cgroups, self.limits, self._runner.memory_bytes, traj, executor.proc.pid)
        return executor

    def _spawn_sandbox(self, traj: Trajectory, channel_fd: int) -> subprocess.Popen[bytes]:
        fds: list[int] = []
        try:
            argv = self.launch.executor_argv(traj, channel_fd, fds)
            uid = traj.uid if self._privileged else None
            return subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, cwd="/", env={}, close_fds=True, pass_fds=tuple(fds),
                start_new_session=True, umask=0o022, user=uid, group=uid,
                extra_groups=[] if uid is not None else None,
            )
        except OSError as exc:
            raise SandboxSetupError(f"cannot launch bubblewrap: {exc}") from exc
        finally:
            for fd in fds:
                if fd != channel_fd:
                    os.close(fd)

    def _alloc_uid(self) -> int:
        return self.uids.take() if self._privileged else os.getuid()

    def _enter(self, trajectory_id: str) -> Trajectory:
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

    def _create(self, trajectory_id: str) -> Trajectory:
        home = self.instance_dir / workdir_name(validate_trajectory_id(trajectory_id))
        if home.exists():
            self.homes.remove(home)
        ready = self._ready.take(home, trajectory_id)
        if ready is not None:
            self._trajs[trajectory_id] = ready
            return ready
        traj = self._new_sandbox(trajectory_id, home)
        self._trajs[trajectory_id] = traj
        return traj

    def _make_ready(self) -> Trajectory:
        """A started sandbox for a trajectory to come (see :mod:`.ready`)."""
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox backend is closed")
            self._made += 1
            traj = self._new_sandbox("(ready)", self.instance_dir / f"{READY_PREFIX}{self._made}")
        try:
            traj.executor = self._start_executor(traj)
        except BaseException:
            self._discard_ready(traj)
            raise
        return traj

    def _discard_ready(self, traj: Trajectory) -> None:
        traj.ended = True
        if traj.executor is not None:
            traj.executor.close()
        self._dispose(traj)

    def _new_sandbox(self, trajectory_id: str, home: Path) -> Trajectory:
        """A uid and a home at ``home`` with an empty work dir; the caller holds the lock."""
        uid = self._alloc_uid()
        try:
            self.homes.make(home, uid)
        except OSError as exc:
            self._release_uid(uid)
            raise SandboxSetupError(f"cannot create a work dir in {self.instance_dir}: "
                                    f"{exc.strerror}") from exc
        return Trajectory(trajectory_id, uid, home)

    def _leave(self, traj: Trajectory) -> None:
        with self._lock:
            traj.active -= 1
            release = traj.ended and traj.active == 0
        if release:
            self._release_uid_when_clean(traj)

    def _set_aside(self, traj: Trajectory) -> None:
        """Move an ended trajectory's work dir out of its id's place, so a new trajectory of
        the same id gets a dir of its own that this one's removal cannot touch; the caller
        holds the lock."""
        aside = self.instance_dir / f"{ENDED_PREFIX}{next(self._ended)}"
        with contextlib.suppress(OSError):
            traj.home.rename(aside)
            traj.home = aside

    def _dispose(self, traj: Trajectory) -> None:
        """Remove an ended trajectory's dir and cgroups; give its uid back once no action is
        running."""
        unhouse(traj)
        self.homes.remove(traj.home)
        with self._lock:
            idle = traj.active == 0
        if idle:
            self._release_uid_when_clean(traj)

    def _release_uid_when_clean(self, traj: Trajectory) -> None:
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
    def _ended_error(traj: Trajectory) -> SandboxError:
        return SandboxError(f"trajectory {traj.trajectory_id!r} was ended while its action ran")
