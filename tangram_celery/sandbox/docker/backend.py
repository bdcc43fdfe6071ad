"""The Docker sandbox backend: its public interface and what it does to run one action.

Its containers (warm pool, trajectories, removal) belong to its
:class:`~tangram_celery.sandbox.docker.pool.ContainerPool`. An action pins the trajectory's
container to its cores, execs the wrapper, pumps the exec's socket, concludes from the trailer
and throttles the container again.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import CancelledError
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from tangram_celery.errors import (
    SandboxError,
    SandboxLostError,
    SandboxSetupError,
    SandboxSpecError,
)
from tangram_celery.sandbox.base import (
    BASE_ENV,
    INSIDE_WORKDIR,
    MB,
    ExecOutcome,
    ExecSpec,
    RunControl,
    SandboxLimits,
)
from tangram_celery.sandbox.docker.engine import (
    DEFAULT_DOCKER_URL,
    check_image,
    connect,
    not_running,
)
from tangram_celery.sandbox.docker.image import DEFAULT_TAG
from tangram_celery.sandbox.docker.link import End, Request, ResidentLost, Stamps
from tangram_celery.sandbox.docker.options import seccomp_profile
from tangram_celery.sandbox.docker.policy import WarmPoolPolicy
from tangram_celery.sandbox.docker.pool import Box, ContainerPool, Env, mark_broken
from tangram_celery.sandbox.docker.protocol import Broken, command_start, exit_status, units_of
from tangram_celery.sandbox.docker.runs import exec_control
from tangram_celery.sandbox.isolation import CGROUP, CPUSET, STRICT, TMPFS, Isolation
from tangram_celery.sandbox.output import CappedBuffer
from tangram_celery.sandbox.parallelism import rewrite_parallelism
from tangram_celery.sandbox.uids import UidPool, default_lock_dir
from tangram_celery.sandbox.validation import SpecFile, sandbox_env, validate_spec

SH = "/bin/sh"

DockerExecOutcome = ExecOutcome
"""The docker backend's outcome; ``environment_replaced``/``replaced_reason`` say whether the
trajectory's container was replaced (its files were lost) before this action, and why."""


@dataclass
class _Run:
    """One action in flight: its sinks and timing."""

    stdout: CappedBuffer
    stderr: CappedBuffer
    stamps: Stamps
    t_start: float
    started_at: float


class DockerBackend:
    """The Docker sandbox backend (see :mod:`tangram_celery.sandbox.docker`). Thread-safe.

    Actions of one trajectory run one at a time (its container has one cpuset); actions of
    different trajectories run in parallel.
    """

    name = "docker"
    repins = True
    isolation = Isolation(STRICT, "docker", CPUSET, CGROUP, CGROUP, TMPFS)

    def __init__(
        self,
        root_dir: Path,
        limits: SandboxLimits,
        *,
        docker_url: str = DEFAULT_DOCKER_URL,
        image: str = DEFAULT_TAG,
        idle_ttl_s: float = 900.0,
        warm_pool: WarmPoolPolicy | None = None,
        api_timeout_s: float = 30.0,
        grace_s: float = 5.0,
        setup_timeout_s: float = 120.0,
        seccomp: bool = True,
        tick_s: float = 0.5,
        direct_cpu: bool = True,
        uid_base: int = 1_500_000,
        uid_count: int = 65_536,
        uid_lock_dir: Path | None = None,
    ) -> None:
        """Connect to the engine at ``docker_url`` and start the pool keeper.

        ``root_dir`` is kept for interface parity (work dirs live in the containers).
        Raises :class:`SandboxEngineError` when no engine answers (it never hangs: every call
        has ``api_timeout_s``) and :class:`SandboxSetupError` when ``image`` is missing.
        ``idle_ttl_s``: a trajectory idle that long loses its container. ``grace_s``: how long
        past ``timeout_s`` the client waits on an exec before it declares the container broken.
        Each container's actions run as a host uid of their own, from ``uid_base`` to
        ``uid_base + uid_count - 1`` (no account may use them; there is no user namespace, so
        the uid inside is the uid on the engine's host), held through a lock file in
        ``uid_lock_dir`` (default: the host's, shared with the embedded backend, for root; a
        private one under the temp dir for another user).
        """
        self.root_dir = Path(root_dir)
        self.limits = limits
        self.image = image
        self.grace_s = grace_s
        self.setup_timeout_s = setup_timeout_s
        self.client = connect(docker_url, api_timeout_s)
        self.docker_url = docker_url
        check_image(self.client, image, docker_url)
        profile = seccomp_profile() if seccomp else None
        self.available_cores = frozenset(range(int(self.client.info().get("NCPU", 1))))
        self.uids = UidPool(uid_base, uid_count, uid_lock_dir or default_lock_dir())
        self._pool = ContainerPool(
            self.client, docker_url=docker_url, image=image, limits=limits, seccomp=profile,
            policy=warm_pool if warm_pool is not None else WarmPoolPolicy(),
            idle_ttl_s=idle_ttl_s, tick_s=tick_s, uids=self.uids,
            setup_timeout_s=setup_timeout_s, direct_cpu=direct_cpu)
        self.owner = self._pool.owner

    # -- public interface -------------------------------------------------------------------

    def run(self, spec: ExecSpec) -> DockerExecOutcome:
        """Run ``spec`` in its trajectory's container (taking one on first use)."""
        t0 = time.monotonic()
        files = validate_spec(spec, self.limits, self.available_cores)
        if spec.memory_mb is not None and spec.memory_mb > self.limits.memory_mb:
            raise SandboxSpecError("memory_mb", f"the docker backend holds each container at "
                                   f"{self.limits.memory_mb} MiB (TANGRAM_SANDBOX_MEMORY_MB); "
                                   f"raise it to run actions of {spec.memory_mb} MiB")
        env = self._pool.enter(spec.trajectory_id)
        try:
            with env.lock:
                return self._run_locked(env, spec, files, t0)
        finally:
            self._pool.leave(env)

    def repin(self, trajectory_id: str, cores: tuple[int, ...], new_cores: tuple[int, ...]
              ) -> bool:
        """Move the running action of ``trajectory_id`` pinned to ``cores`` onto ``new_cores``
        (its container's cpuset and CFS quota: it leaves the other cores at once). False,
        changing nothing, when no such action runs now or the engine refuses."""
        to = tuple(sorted(set(new_cores)))
        env = self._pool.get(trajectory_id)
        if env is None or not to or not set(to) <= self.available_cores:
            return False
        with env.pin_lock:
            box = env.box
            if box is None or env.pinned != tuple(sorted(set(cores))):
                return False
            try:
                box.cpu.pin(to)
            except (Broken, SandboxSpecError):
                return False
            env.pinned = to
            return True

    def run_control(self, trajectory_id: str, name: str) -> RunControl | None:
        """The control of the malleable run listening at ``name`` in the work dir of
        ``trajectory_id``'s running action, one ``docker exec`` per request (None: no action
        of the trajectory runs now)."""
        env = self._pool.get(trajectory_id)
        box = None if env is None else env.box
        if env is None or box is None or env.pinned is None:
            return None
        return partial(exec_control, box.container, box.uid, f"{INSIDE_WORKDIR}/{name}")

    def end_trajectory(self, trajectory_id: str) -> None:
        """Remove the trajectory's container (killing a running action); idempotent."""
        self._pool.end(trajectory_id, idle_since=None)

    def trajectories(self) -> list[str]:
        """The ids of the trajectories that hold an environment now."""
        return self._pool.trajectories()

    def pool_size(self) -> int:
        """How many ready containers wait in the warm pool now."""
        return self._pool.size()

    def containers(self) -> list[str]:
        """The ids of every container of this backend (trajectories' and the pool's)."""
        return self._pool.containers()

    def close(self) -> None:
        """End every trajectory, empty the pool, wait for the removals; idempotent."""
        if self._pool.close():
            self.client.close()

    def reap_stale(self) -> int:
        """Remove containers of backends whose process died on this host; returns how many."""
        return self._pool.reap_stale()

    def __enter__(self) -> DockerBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one action -------------------------------------------------------------------------

    def _run_locked(
        self, env: Env, spec: ExecSpec, files: list[SpecFile], t0: float
    ) -> DockerExecOutcome:
        self._wait_settled(env)
        for attempt in (1, 2):
            if env.box is None or env.broken is not None:
                self._pool.replace(env)
            try:
                outcome = self._attempt(env, spec, files, t0)
            except Broken as exc:
                mark_broken(env, str(exc))
                if env.ended:
                    raise _ended(env) from exc
                if attempt == 2:
                    raise SandboxSetupError(
                        f"the sandbox container failed twice for trajectory "
                        f"{env.trajectory_id!r}: {exc}") from exc
                continue
            lost, env.lost = env.lost, None
            return replace(outcome, environment_replaced=lost is not None,
                           replaced_reason=lost or "")
        raise AssertionError("unreachable")

    def _wait_settled(self, env: Env) -> None:
        if env.settle is not None:
            with contextlib.suppress(TimeoutError, CancelledError):
                env.settle.result(timeout=30)
            env.settle = None

    def _attempt(
        self, env: Env, spec: ExecSpec, files: list[SpecFile], t0: float
    ) -> DockerExecOutcome:
        box = env.box
        if box is None:
            raise Broken("the trajectory has no container")
        with env.pin_lock:
            box.cpu.pin(spec.cores)
            env.pinned = tuple(sorted(set(spec.cores)))
        command = rewrite_parallelism(spec.command, max(units_of(spec), 1))
        stdin = None if spec.stdin is None else spec.stdin.encode("utf-8", "surrogateescape")
        request = Request(argv=[SH, "-c", command], env=sandbox_env(spec, BASE_ENV),
                          cwd=INSIDE_WORKDIR, timeout_s=spec.timeout_s, files=files, stdin=stdin)
        cap = self.limits.output_cap_bytes if spec.output_cap_bytes is None \
            else spec.output_cap_bytes
        run = _Run(CappedBuffer(cap), CappedBuffer(cap), Stamps(), time.monotonic(), time.time())
        setup_deadline = run.t_start + self.setup_timeout_s

        def deadline() -> float:
            started = run.stamps.started
            return setup_deadline if started is None else started + spec.timeout_s + self.grace_s

        try:
            end = box.resident.run(request, run.stdout, run.stderr, run.stamps, deadline,
                                   probe=lambda: not_running(box.container))
        except ResidentLost as exc:
            mark_broken(env, f"its executor died: {exc}")
            raise self._lost(env, exc) from exc
        finally:
            self._after(env, box)
        return self._conclude(env, spec, run, end, t0)

    def _after(self, env: Env, box: Box) -> None:
        """Hand the cores back: throttle the container (in the background through the API)."""
        with env.pin_lock:
            env.pinned = None
        if box.cpu.kind == "api":
            env.settle = self._pool.background.submit(self._settle, env, box)
        else:
            self._settle(env, box)

    def _settle(self, env: Env, box: Box) -> None:
        try:
            box.cpu.idle()
        except Broken as exc:
            with self._pool.lock:
                if env.box is box and env.broken is None:
                    mark_broken(env, str(exc))

    @staticmethod
    def _lost(env: Env, exc: Exception) -> SandboxError:
        if env.ended:
            return _ended(env)
        return SandboxLostError(
            f"sandbox_lost: trajectory {env.trajectory_id!r}: its container's executor died "
            f"while the action ran ({exc}); the action's result is unknown and it was not rerun. "
            "The container's files are lost and the next action starts in a fresh container"
        )

    def _conclude(
        self, env: Env, spec: ExecSpec, run: _Run, end: End | None, t0: float
    ) -> DockerExecOutcome:
        now, finished_at = time.monotonic(), time.time()
        if env.ended:
            raise _ended(env)
        if end is None:
            mark_broken(env, f"the executor did not end the action within timeout_s + "
                             f"{self.grace_s} s")
            return self._outcome(run, None, t0, now, finished_at)
        env.used = True
        return self._outcome(run, end, t0, now, finished_at, env=env)

    def _outcome(
        self, run: _Run, end: End | None, t0: float, now: float, finished_at: float,
        env: Env | None = None,
    ) -> DockerExecOutcome:
        timed_out = end is None or end.timed_out
        ready = command_start(t0, run.stamps.started, now, None if end is None else end.elapsed_s)
        exit_code, sig = exit_status(None if end is None else end.exit_code, timed_out=timed_out)
        usage = None if end is None else end.workdir_bytes
        exceeded = usage is not None and usage > self.limits.workdir_mb * MB
        if exceeded and env is not None:
            with self._pool.lock:
                env.exceeded = True
        return DockerExecOutcome(
            exit_code=exit_code, signal=sig, timed_out=timed_out,
            oom_killed=end is not None and end.oom_after > end.oom_before,
            stdout=run.stdout.text(), stderr=run.stderr.text(),
            stdout_truncated=run.stdout.truncated, stderr_truncated=run.stderr.truncated,
            stdout_cut_bytes=run.stdout.cut, stderr_cut_bytes=run.stderr.cut,
            started_at=run.started_at, finished_at=finished_at,
            setup_s=max(ready - t0, 0.0), exec_s=max(now - ready, 0.0),
            workdir_bytes=usage or 0, workdir_exceeded=exceeded,
        )


def _ended(env: Env) -> SandboxError:
    return SandboxError(f"trajectory {env.trajectory_id!r} was ended while its action ran")
