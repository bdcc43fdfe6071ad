"""One action in the embedded backend: its cgroups, the launch, its output until exit or timeout.

The wall-clock timeout SIGKILLs bubblewrap, whose death takes down the sandbox's pid namespace,
and then every pid left in the action's cgroups; the process is reaped either way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time

from tangram_celery.errors import SandboxSetupError
from tangram_celery.sandbox.base import MB, ExecOutcome, ExecSpec, SandboxLimits
from tangram_celery.sandbox.bwrap.launch import READY_MARKER, LaunchChain
from tangram_celery.sandbox.bwrap.trajectory import Pin, Trajectory
from tangram_celery.sandbox.cgroup import ActionCgroup, CgroupLimits, CgroupV1
from tangram_celery.sandbox.output import CappedBuffer, ReadyMarker, Sink, pump
from tangram_celery.sandbox.workdir import dir_usage


class ActionRunner:
    """Runs the actions of the backend's trajectories, one call of :meth:`execute` each.

    ``lock`` is the backend's: it guards the trajectories' processes, pins and flags.
    """

    def __init__(
        self,
        limits: SandboxLimits,
        launch: LaunchChain,
        cgroups: CgroupV1 | None,
        lock: threading.Lock,
        *,
        privileged: bool,
    ) -> None:
        self.limits = limits
        self.launch = launch
        self.cgroups = cgroups
        self._lock = lock
        self._privileged = privileged

    def execute(self, spec: ExecSpec, traj: Trajectory, t0: float) -> ExecOutcome:
        """Run ``spec`` (its files written) in ``traj``'s sandbox; ``t0``: when the call began."""
        group = self._make_cgroup(spec, traj)
        pin = None if group is None else Pin(core_set(spec.cores), group)
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

    def _make_cgroup(self, spec: ExecSpec, traj: Trajectory) -> ActionCgroup | None:
        if self.cgroups is None:
            return None
        limits = CgroupLimits(self.limits.memory_mb * MB, self.limits.pids, spec.cores)
        try:
            return self.cgroups.create(limits, traj.uid, traj.uid)
        except OSError as exc:
            raise SandboxSetupError(f"cannot create the action's cgroups: {exc}") from exc

    def _spawn_and_wait(
        self, spec: ExecSpec, traj: Trajectory, group: ActionCgroup | None, t0: float
    ) -> ExecOutcome:
        stdout = CappedBuffer(self.limits.output_cap_bytes)
        stderr = CappedBuffer(self.limits.output_cap_bytes)
        marker = ReadyMarker(READY_MARKER, stderr)
        stdin_data = spec.stdin.encode("utf-8", "surrogateescape") if spec.stdin else None
        started_at = time.time()
        proc = self._spawn(spec, traj, group, stdin_wanted=stdin_data is not None)
        try:
            finished, returncode = _wait(proc, group, {1: stdout, 2: marker},
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
            stdout_cut_bytes=stdout.cut, stderr_cut_bytes=stderr.cut,
            started_at=started_at, finished_at=finished_at,
            setup_s=max(ready - t0, 0.0), exec_s=max(end - ready, 0.0),
            workdir_bytes=usage, workdir_exceeded=exceeded,
        )

    def _spawn(
        self, spec: ExecSpec, traj: Trajectory, group: ActionCgroup | None, *, stdin_wanted: bool
    ) -> subprocess.Popen[bytes]:
        fds: list[int] = []
        try:
            argv = self.launch.argv(spec, traj, group, fds)
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
            kill_proc(proc, group)
        return proc

    def _forget(self, traj: Trajectory, proc: subprocess.Popen[bytes]) -> None:
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        with self._lock:
            traj.procs.discard(proc)

    def _check_workdir(self, traj: Trajectory) -> tuple[int, bool]:
        quota = self.limits.workdir_mb * MB
        usage = dir_usage(traj.path, stop_above=quota)
        exceeded = usage > quota
        if exceeded:
            with self._lock:
                traj.exceeded = True
        return usage, exceeded


def _wait(
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
            kill_proc(proc, group)
            pump(proc, sinks, None, time.monotonic() + 2.0)
        return finished, _reap(proc, group)
    except BaseException:
        kill_proc(proc, group)
        proc.wait()
        raise


def kill_proc(proc: subprocess.Popen[bytes], group: ActionCgroup | None = None) -> None:
    """SIGKILL bubblewrap (its sandbox dies with it) and whatever is left in the cgroups."""
    if proc.poll() is None:  # not reaped yet, so its pid (and process group) is still ours
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    if group is not None:
        group.kill()


def _reap(proc: subprocess.Popen[bytes], group: ActionCgroup | None) -> int:
    try:
        return proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        kill_proc(proc, group)
        return proc.wait()


def core_set(cores: tuple[int, ...]) -> tuple[int, ...]:
    """The distinct cores of a unit list, sorted (how a cpuset holds them)."""
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
