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
from pathlib import Path
from typing import Any

import docker.errors

from tangram_celery.errors import SandboxError, SandboxSetupError, SandboxSpecError
from tangram_celery.sandbox.base import (
    BASE_ENV,
    INSIDE_WORKDIR,
    MB,
    ExecOutcome,
    ExecSpec,
    SandboxLimits,
)
from tangram_celery.sandbox.docker.engine import (
    API_ERRORS,
    DEFAULT_DOCKER_URL,
    RESET_ERRORS,
    check_image,
    connect,
    diagnose,
    exec_exit_code,
)
from tangram_celery.sandbox.docker.exchange import Exchange, pump_socket, raw_socket, read_ahead
from tangram_celery.sandbox.docker.options import cpu_options, idle_cpu_options, seccomp_profile
from tangram_celery.sandbox.docker.policy import WarmPoolPolicy
from tangram_celery.sandbox.docker.pool import ContainerPool, Env, mark_broken
from tangram_celery.sandbox.docker.protocol import (
    READY_MARKER,
    Broken,
    FrameDemuxer,
    Trailer,
    TrailerSink,
    command_start,
    exit_status,
    preamble_error,
    stdin_payload,
    units_of,
    wrapper_argv,
)
from tangram_celery.sandbox.image import DEFAULT_TAG, SANDBOX_UID
from tangram_celery.sandbox.output import CappedBuffer, ReadyMarker
from tangram_celery.sandbox.parallelism import rewrite_parallelism
from tangram_celery.sandbox.validation import SpecFile, sandbox_env, validate_spec

DockerExecOutcome = ExecOutcome
"""The docker backend's outcome; ``environment_replaced``/``replaced_reason`` say whether the
trajectory's container was replaced (its files were lost) before this action, and why."""


@dataclass
class _Run:
    """One exec in flight: its sinks and timing."""

    stdout: CappedBuffer
    stderr: CappedBuffer
    trailer_sink: TrailerSink
    marker: ReadyMarker
    engine_err: CappedBuffer
    t_start: float
    started_at: float


class DockerBackend:
    """The Docker sandbox backend (see :mod:`tangram_celery.sandbox.docker`). Thread-safe.

    Actions of one trajectory run one at a time (its container has one cpuset); actions of
    different trajectories run in parallel.
    """

    name = "docker"

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
    ) -> None:
        """Connect to the engine at ``docker_url`` and start the pool keeper.

        ``root_dir`` is kept for interface parity (work dirs live in the containers).
        Raises :class:`SandboxEngineError` when no engine answers (it never hangs: every call
        has ``api_timeout_s``) and :class:`SandboxSetupError` when ``image`` is missing.
        ``idle_ttl_s``: a trajectory idle that long loses its container. ``grace_s``: how long
        past ``timeout_s`` the client waits on an exec before it declares the container broken.
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
        self._pool = ContainerPool(
            self.client, docker_url=docker_url, image=image, limits=limits, seccomp=profile,
            policy=warm_pool if warm_pool is not None else WarmPoolPolicy(),
            idle_ttl_s=idle_ttl_s, tick_s=tick_s)
        self.owner = self._pool.owner

    # -- public interface -------------------------------------------------------------------

    def run(self, spec: ExecSpec) -> DockerExecOutcome:
        """Run ``spec`` in its trajectory's container (taking one on first use)."""
        t0 = time.monotonic()
        files = validate_spec(spec, self.limits, self.available_cores)
        env = self._pool.enter(spec.trajectory_id)
        try:
            with env.lock:
                return self._run_locked(env, spec, files, t0)
        finally:
            self._pool.leave(env)

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
            if env.container is None or env.broken is not None:
                self._pool.replace(env)
            try:
                outcome = self._attempt(env, spec, files, t0)
            except Broken as exc:
                mark_broken(env, str(exc))
                if env.ended:
                    raise SandboxError(f"trajectory {env.trajectory_id!r} was ended while its "
                                       "action ran") from exc
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

    @staticmethod
    def _pin(container: Any, cores: tuple[int, ...]) -> None:
        try:
            container.update(**cpu_options(cores))
        except docker.errors.APIError as exc:
            if "not available" in str(exc):
                raise SandboxSpecError("cores", f"{exc}; allocate cores the engine has") from exc
            raise Broken(f"cannot pin the container to cores {list(cores)}: {exc}") from exc
        except API_ERRORS as exc:
            raise Broken(f"cannot pin the container: {exc}") from exc

    def _settle(self, env: Env, container: Any) -> None:
        """After an action: hand the cores back by throttling the container to 1% of a core."""
        try:
            container.update(**idle_cpu_options())
        except API_ERRORS as exc:
            with self._pool.lock:
                if env.container is container and env.broken is None:
                    mark_broken(env, f"cannot throttle the container after an action: {exc}")

    def _attempt(
        self, env: Env, spec: ExecSpec, files: list[SpecFile], t0: float
    ) -> DockerExecOutcome:
        container = env.container
        self._pin(container, spec.cores)
        command = rewrite_parallelism(spec.command, max(units_of(spec), 1))
        payload = stdin_payload(spec, files)
        run = _Run(*self._sinks(), t_start=time.monotonic(), started_at=time.time())
        try:
            exec_id, finished = self._exec(container, spec, command, files, payload, run)
        finally:
            env.settle = self._pool.background.submit(self._settle, env, container)
        return self._conclude(env, spec, run, exec_id, finished, t0)

    def _sinks(self) -> tuple[CappedBuffer, CappedBuffer, TrailerSink, ReadyMarker, CappedBuffer]:
        cap = self.limits.output_cap_bytes
        stdout, stderr = CappedBuffer(cap), CappedBuffer(cap)
        trailer = TrailerSink(stderr)
        return stdout, stderr, trailer, ReadyMarker(READY_MARKER, trailer), CappedBuffer(4096)

    def _exec(
        self, container: Any, spec: ExecSpec, command: str, files: list[SpecFile],
        payload: bytes | None, run: _Run,
    ) -> tuple[str, bool]:
        """Start the wrapper and pump its socket; (exec id, finished before the deadline)."""
        env_vars = sandbox_env(spec, BASE_ENV)
        argv = wrapper_argv(spec.timeout_s, command, bool(files))
        try:
            exec_id = self.client.api.exec_create(
                container.id, argv, stdout=True, stderr=True, stdin=payload is not None,
                tty=False, environment=env_vars, workdir=INSIDE_WORKDIR,
                user=f"{SANDBOX_UID}:{SANDBOX_UID}")["Id"]
            handle = self.client.api.exec_start(exec_id, socket=True)
        except API_ERRORS as exc:
            raise Broken(f"cannot exec in the container: {exc}") from exc
        sock = raw_socket(handle)
        try:
            sock.setblocking(False)
            first = read_ahead(handle)
            setup_deadline = run.t_start + self.setup_timeout_s

            def deadline() -> float:
                ready = run.marker.ready_at
                return setup_deadline if ready is None else ready + spec.timeout_s + self.grace_s

            exchange = Exchange(sock, FrameDemuxer(), {1: run.stdout, 2: run.marker,
                                                       3: run.engine_err}, payload, deadline)
            finished = pump_socket(exchange, first)
        finally:
            with contextlib.suppress(OSError):
                sock.close()
            with contextlib.suppress(OSError, AttributeError):
                handle.close()
        return exec_id, finished

    def _conclude(
        self, env: Env, spec: ExecSpec, run: _Run, exec_id: str, finished: bool, t0: float
    ) -> DockerExecOutcome:
        end, finished_at = time.monotonic(), time.time()
        trailer = run.trailer_sink.finish(end)
        if env.ended:
            raise SandboxError(f"trajectory {env.trajectory_id!r} was ended while its action ran")
        if not finished:
            mark_broken(env, f"the exec did not end within timeout_s + {self.grace_s} s")
            return self._outcome(run, None, t0, end, finished_at, timed_out=True)
        code = exec_exit_code(self.client, exec_id)
        if run.marker.ready_at is None:
            raise self._startup_error(env, run, code)
        env.used = True
        if trailer is None:
            oom = self._reset(env)
            return self._outcome(run, None, t0, end, finished_at, code=code, oom=oom,
                                 timed_out=end - run.marker.ready_at >= spec.timeout_s)
        env.oom_seen = trailer.oom_after
        timed_out = trailer.exit_code == 137 and trailer.elapsed_s >= spec.timeout_s - 0.011
        return self._outcome(run, trailer, t0, end, finished_at, code=trailer.exit_code,
                             timed_out=timed_out, env=env)

    def _startup_error(self, env: Env, run: _Run, code: int | None) -> SandboxError:
        preamble = bytes(run.marker.preamble)
        reported = preamble_error(preamble)
        if reported is not None:
            return reported
        detail = (preamble + bytes(run.engine_err.data) + bytes(run.stderr.data))
        text = detail.decode("utf-8", "replace").strip() or diagnose(env.container)
        return Broken(f"the sandbox wrapper did not start (exit {code}): {text}")

    def _reset(self, env: Env) -> bool:
        """After an action whose wrapper died: kill what is left, read the OOM counter.

        Returns whether an OOM kill happened; marks the container broken if this fails.
        """
        script = ("kill -9 -1 2>/dev/null; o=0; for f in /sys/fs/cgroup/memory/memory.oom_control "
                  "/sys/fs/cgroup/memory.events; do [ -r $f ] || continue; while read -r k v; "
                  "do [ $k = oom_kill ] && o=$v; done < $f; break; done; echo $o")
        container = env.container
        if container is None:
            return False
        try:
            result = container.exec_run(["/bin/sh", "-c", script],
                                            user=f"{SANDBOX_UID}:{SANDBOX_UID}")
            count = int(result.output.decode().strip().splitlines()[-1])
        except RESET_ERRORS as exc:
            mark_broken(env, f"cannot reset the container after an action: {exc}")
            return False
        oom, env.oom_seen = count > env.oom_seen, count
        return oom

    def _outcome(
        self,
        run: _Run,
        trailer: Trailer | None,
        t0: float,
        end: float,
        finished_at: float,
        *,
        timed_out: bool,
        code: int | None = None,
        oom: bool = False,
        env: Env | None = None,
    ) -> DockerExecOutcome:
        ready = command_start(t0, run.marker.ready_at, end, trailer)
        exit_code, sig = exit_status(code, timed_out=timed_out)
        usage = trailer.workdir_bytes if trailer is not None else None
        exceeded = usage is not None and usage > self.limits.workdir_mb * MB
        if exceeded and env is not None:
            with self._pool.lock:
                env.exceeded = True
        return DockerExecOutcome(
            exit_code=exit_code, signal=sig, timed_out=timed_out,
            oom_killed=trailer.oom_killed if trailer is not None else oom,
            stdout=run.stdout.text(), stderr=run.stderr.text(),
            stdout_truncated=run.stdout.truncated, stderr_truncated=run.stderr.truncated,
            stdout_cut_bytes=run.stdout.cut, stderr_cut_bytes=run.stderr.cut,
            started_at=run.started_at, finished_at=finished_at,
            setup_s=max(ready - t0, 0.0), exec_s=max(end - ready, 0.0),
            workdir_bytes=usage or 0, workdir_exceeded=exceeded,
        )
