"""One action in the embedded backend: its cgroups, its child in the warm executor, its output.

The node makes the action's pipes and control socket and hands them to the trajectory's warm
executor (:mod:`~tangram_celery.sandbox.bwrap.warm`), which starts the child. An action alone in
its trajectory is born in the trajectory's cgroups, their cpuset already set to its cores, and
runs at once (a command is spawned, not forked); a concurrent one's child reports its pid
(kernel-attested), and the node moves it into the action's own cgroups (memory, pids, its
exclusive cpuset) and only then lets it run. The node reads the output from its own pipes and
the exit status from the executor's ``waitpid``. At exit, or at the wall-clock timeout, every
process of the action is SIGKILLed (its cgroups, its process group, and, when no other action of
the trajectory runs, everything in the sandbox but the executor).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from typing import IO, Any, cast

from tangram_celery.errors import SandboxError, SandboxLostError, SandboxSetupError
from tangram_celery.sandbox.base import (
    BASE_ENV,
    INSIDE_WORKDIR,
    MB,
    ExecOutcome,
    ExecSpec,
    SandboxLimits,
)
from tangram_celery.sandbox.bwrap.launch import action_rlimits
from tangram_celery.sandbox.bwrap.placement import (
    ChildGone,
    held,
    kill_rest,
    killer,
    moved,
    place_child,
)
from tangram_celery.sandbox.bwrap.trajectory import Pin, Trajectory
from tangram_celery.sandbox.bwrap.warm import LOST, WarmExecutor, control_pair
from tangram_celery.sandbox.cgroups import ActionCgroup, CgroupLimits, Hierarchy
from tangram_celery.sandbox.output import CappedBuffer, pump
from tangram_celery.sandbox.validation import sandbox_env
from tangram_celery.sandbox.workdir import dir_usage

log = logging.getLogger(__name__)
SH = "/bin/sh"
PLACE_TIMEOUT_S = 10.0
LAUNCH_TRIES = 2
"""Launches of one action when its child is gone before it was placed (it ran nothing)."""
EXIT_GRACE_S = 5.0


class _Streams:
    """The node's ends of an action's pipes, shaped as :func:`pump` reads a process."""

    def __init__(self, stdin: IO[bytes] | None, stdout: IO[bytes], stderr: IO[bytes],
                 control: socket.socket) -> None:
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.control = control

    def not_started(self) -> str | None:
        """Why the child could not start the action (it says so on its control socket, before
        user code runs), or None when it started it."""
        with contextlib.suppress(OSError):
            self.control.setblocking(False)
            data = self.control.recv(4096)
            if data.startswith(b"e"):
                return data[1:].decode(errors="replace")
        return None

    def close(self) -> None:
        for stream in (self.stdin, self.stdout, self.stderr, self.control):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


class ActionRunner:
    """Runs the actions of the backend's trajectories, one call of :meth:`execute` each.

    ``lock`` is the backend's: it guards the trajectories' pins and flags. ``start_executor``
    starts a trajectory's warm executor.
    """

    def __init__(
        self,
        limits: SandboxLimits,
        cgroups: Hierarchy | None,
        lock: threading.Lock,
        start_executor: Callable[[Trajectory], WarmExecutor],
        memory_bytes: int,
    ) -> None:
        self.limits = limits
        self.cgroups = cgroups
        self.memory_bytes = memory_bytes
        self._lock = lock
        self._start_executor = start_executor

    def execute(self, spec: ExecSpec, traj: Trajectory, t0: float) -> ExecOutcome:
        """Run ``spec`` (its files written) in ``traj``'s sandbox; ``t0``: when the call began."""
        executor = self.executor(traj)
        group, shared = self._group_for(spec, traj)
        pin = None if group is None else Pin(core_set(spec.cores), group)
        if pin is not None:
            with self._lock:
                traj.pins.append(pin)
        try:
            return self._run(spec, traj, executor, group, t0)
        finally:
            if pin is not None:
                with self._lock:
                    traj.pins.remove(pin)
            if shared:
                with self._lock:
                    traj.group_busy = False
            elif group is not None:
                group.remove()
            if spec.python is not None:
                with contextlib.suppress(OSError):
                    os.unlink(traj.path / spec.python)

    def executor(self, traj: Trajectory) -> WarmExecutor:
        """The trajectory's live executor, started (again) when it has none."""
        with traj.start_lock:
            current = traj.executor
            if current is not None and current.alive():
                return current
            if current is not None:
                current.close()
            fresh = self._start_executor(traj)
            with self._lock:
                traj.executor = fresh
                ended = traj.ended
            if ended:
                fresh.close()
            return fresh

    def _group_for(self, spec: ExecSpec, traj: Trajectory) -> tuple[ActionCgroup | None, bool]:
        """The action's cgroups, and whether they are the trajectory's own (its child is born
        in them: no migration); its own ones when a concurrent action holds the trajectory's."""
        with self._lock:
            own = traj.group if traj.group is not None and not traj.group_busy else None
            if own is not None:
                traj.group_busy = True
        if own is None:
            return self._make_cgroup(spec, traj), False
        try:
            own.set_cpus(core_set(spec.cores))
            own.set_memory(self.memory_for(spec))
            own.oom_base = own.oom_count()
        except OSError as exc:
            with self._lock:
                traj.group_busy = False
            raise SandboxSetupError(f"cannot set the trajectory's cgroups to cores "
                                    f"{list(spec.cores)} and {self.memory_for(spec)} bytes of "
                                    f"memory: {exc}") from exc
        return own, True

    def memory_for(self, spec: ExecSpec) -> int:
        """The cgroup memory limit of ``spec``'s action: the sandbox's, moved by the action's
        own ``memory_mb`` when it asks for one."""
        if spec.memory_mb is None:
            return self.memory_bytes
        return self.memory_bytes + (spec.memory_mb - self.limits.memory_mb) * MB

    def _make_cgroup(self, spec: ExecSpec, traj: Trajectory) -> ActionCgroup | None:
        if self.cgroups is None:
            return None
        limits = CgroupLimits(self.memory_for(spec), self.limits.pids, spec.cores)
        try:
            return self.cgroups.create(limits, traj.uid, traj.uid)
        except OSError as exc:
            raise SandboxSetupError(f"cannot create the action's cgroups: {exc}") from exc

    def _run(self, spec: ExecSpec, traj: Trajectory, executor: WarmExecutor,
             group: ActionCgroup | None, t0: float) -> ExecOutcome:
        """:meth:`_attempt`, again when the child ran none of the action: it was gone before
        it was placed, or it could not start the command (a new child is then safe, on the
        trajectory's executor, a fresh one if that died)."""
        for attempt in range(1, LAUNCH_TRIES + 1):
            try:
                return self._attempt(spec, traj, executor, group, t0)
            except (ChildGone, _NotStarted) as failed:
                if attempt == LAUNCH_TRIES:
                    raise SandboxSetupError(f"trajectory {traj.trajectory_id!r}: {failed} "
                                            f"({attempt} tries)") from failed
                log.warning("trajectory %s: %s (executor alive: %s); starting it again",
                            traj.trajectory_id, failed, executor.alive())
                executor = self.executor(traj)
        raise AssertionError("unreachable")

    def _attempt(self, spec: ExecSpec, traj: Trajectory, executor: WarmExecutor,
                 group: ActionCgroup | None, t0: float) -> ExecOutcome:
        cap = self.limits.output_cap_bytes if spec.output_cap_bytes is None \
            else spec.output_cap_bytes
        stdout, stderr = CappedBuffer(cap), CappedBuffer(cap)
        stdin_data = spec.stdin.encode("utf-8", "surrogateescape") if spec.stdin else None
        started_at = time.time()
        deadline = time.monotonic() + spec.timeout_s
        streams, action, ready = self._launch(spec, executor, group, stdin_data is not None,
                                              deadline, traj.place_lock)
        try:
            finished = pump(cast(subprocess.Popen[bytes], streams), {1: stdout, 2: stderr},
                            stdin_data, deadline)
            if not finished:
                self._kill(executor, action, group, traj.place_lock)
                pump(cast(subprocess.Popen[bytes], streams), {1: stdout, 2: stderr}, None,
                     time.monotonic() + 2.0)
            status = executor.wait(action, EXIT_GRACE_S)
            if status is None:
                self._kill(executor, action, group, traj.place_lock)
                status = executor.wait(action, EXIT_GRACE_S)
            reason = streams.not_started()
        finally:
            streams.close()
        end, finished_at = time.monotonic(), time.time()
        if status is None or status == LOST:
            raise _lost(traj, executor)
        if reason is not None:
            raise _NotStarted(reason)
        usage, exceeded = self._check_workdir(traj)
        exit_code, sig = _status(os.waitstatus_to_exitcode(status), timed_out=not finished)
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

    def _launch(self, spec: ExecSpec, executor: WarmExecutor, group: ActionCgroup | None,
                stdin_wanted: bool, deadline: float,
                place_lock: threading.Lock) -> tuple[_Streams, int, float]:
        """Hand the action to the executor, place its child in the cgroups, let it go.

        A child to be moved into groups of its own is born in the trajectory's: ``place_lock``
        is held from its fork to its move, and by whatever kills the leftovers in the
        trajectory's groups, so that kill never takes a child not yet moved.
        """
        with place_lock if moved(group) else contextlib.nullcontext():
            return self._launch_child(spec, executor, group, stdin_wanted, deadline, place_lock)

    def _launch_child(self, spec: ExecSpec, executor: WarmExecutor, group: ActionCgroup | None,
                      stdin_wanted: bool, deadline: float,
                      place_lock: threading.Lock) -> tuple[_Streams, int, float]:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe() if stdin_wanted else (os.open(os.devnull, os.O_RDONLY), -1)
        control, child_end = control_pair()
        streams = _Streams(os.fdopen(in_w, "wb", buffering=0) if in_w >= 0 else None,
                           os.fdopen(out_r, "rb", buffering=0),
                           os.fdopen(err_r, "rb", buffering=0), control)
        try:
            action = executor.submit(self._request(spec, group),
                                     [in_r, out_w, err_w, child_end.fileno()],
                                     on_exit=None if spec.keep_processes
                                     else killer(group, place_lock))
        finally:
            for fd in (in_r, out_w, err_w):
                os.close(fd)
            child_end.close()
        try:
            if held(group):
                place_child(control, group, core_set(spec.cores),
                            min(deadline, time.monotonic() + PLACE_TIMEOUT_S))
        except ChildGone:
            streams.close()
            executor.kill(action)
            executor.wait(action, EXIT_GRACE_S)
            raise
        except BaseException:
            streams.close()
            executor.kill(action)
            raise
        return streams, action, time.monotonic()

    def _request(self, spec: ExecSpec, group: ActionCgroup | None) -> dict[str, Any]:
        request: dict[str, Any] = {
            "env": sandbox_env(spec, BASE_ENV), "cwd": INSIDE_WORKDIR,
            "kill_all": not spec.keep_processes,
            "wait_go": held(group),
        }
        if spec.memory_mb is not None or self.limits.ceiling_mb > self.limits.memory_mb:
            request["rlimits"] = action_rlimits(self.limits, spec.memory_mb)
        if spec.python is not None:
            request["python"] = f"{INSIDE_WORKDIR}/{spec.python}"
        else:
            request["argv"] = [SH, "-c", spec.command]
        return request

    @staticmethod
    def _kill(executor: WarmExecutor, action: int, group: ActionCgroup | None,
              place_lock: threading.Lock) -> None:
        executor.kill(action)
        if group is not None:
            kill_rest(group, place_lock)

    def _check_workdir(self, traj: Trajectory) -> tuple[int, bool]:
        quota = self.limits.workdir_mb * MB
        usage = dir_usage(traj.path, stop_above=quota)
        exceeded = usage > quota
        if exceeded:
            with self._lock:
                traj.exceeded = True
        return usage, exceeded


class _NotStarted(Exception):
    """The action's child could not start the command (it ran no user code)."""


def _lost(traj: Trajectory, executor: WarmExecutor) -> SandboxError:
    if traj.ended:
        return SandboxError(f"trajectory {traj.trajectory_id!r} was ended while its action ran")
    code = executor.proc.poll()
    how = "is still running" if code is None else f"exited with status {code}"
    return SandboxLostError(
        f"sandbox_lost: trajectory {traj.trajectory_id!r}: its warm executor died while the "
        f"action ran (bubblewrap {how}); the action's result is unknown and it was not rerun. "
        "The work dir is kept and the next action starts a fresh executor"
    )


def kill_proc(proc: subprocess.Popen[bytes], group: ActionCgroup | None = None) -> None:
    """SIGKILL bubblewrap (its sandbox dies with it) and whatever is left in the cgroups."""
    if proc.poll() is None:  # not reaped yet, so its pid (and process group) is still ours
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    if group is not None:
        group.kill()


def core_set(cores: tuple[int, ...]) -> tuple[int, ...]:
    """The distinct cores of a unit list, sorted (how a cpuset holds them)."""
    return tuple(sorted(set(cores)))


def _status(returncode: int, *, timed_out: bool) -> tuple[int | None, int | None]:
    """(exit_code, signal) from the child's status (``-n`` or ``128 + n`` for signal ``n``)."""
    if timed_out:
        return None, int(signal.SIGKILL)
    if returncode < 0:
        return 128 - returncode, -returncode
    if 128 < returncode <= 128 + 64:
        return returncode, returncode - 128
    return returncode, None
