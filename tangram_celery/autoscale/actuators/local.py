"""The embedded default actuator: CPU pool members as ``tangram worker cpu`` subprocesses."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import redis

from tangram_celery.autoscale.actuators.members import MemberActuator
from tangram_celery.pools.launch import spawn_cpu_worker
from tangram_celery.pools.registry import Registry
from tangram_celery.processes import stop_process


class LocalProcessActuator(MemberActuator):
    """CPU node workers as local ``tangram worker cpu`` subprocesses (the embedded default)."""

    def __init__(
        self, client: redis.Redis, env: Mapping[str, str], cores: int, memory_mb: float,
        log_dir: Path, prefix: str = "auto", drain_timeout_s: float = 600.0,
        clock: Callable[[], float] = time.time, *, registry: Registry | None = None,
        startup_grace_s: float = 30.0,
    ) -> None:
        super().__init__(client, cores, memory_mb, prefix, drain_timeout_s, clock,
                         registry=registry, startup_grace_s=startup_grace_s)
        self._env = dict(env)
        self._log_dir = log_dir

    def _start(self, name: str) -> subprocess.Popen[bytes]:
        return spawn_cpu_worker(self._env, name, self.cores, self._log_dir / f"{name}.log",
                                extra_args=["--memory-mb", f"{self.memory_mb:g}"])

    def _stop(self, handle: object) -> None:
        assert isinstance(handle, subprocess.Popen)
        stop_process(handle)

    def _exited(self, handle: object) -> bool:
        assert isinstance(handle, subprocess.Popen)
        return handle.poll() is not None
