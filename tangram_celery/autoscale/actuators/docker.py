"""The Docker actuator: CPU pool members as containers started with the ``docker`` SDK.

They are labelled ``tangram.pool``, optionally as replicas of a compose service (see
:class:`ContainerTemplate`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis
from docker import errors as docker_errors

from tangram_celery.autoscale.actuators.interface import CPU_POOL
from tangram_celery.autoscale.actuators.members import MemberActuator
from tangram_celery.pools.registry import Registry


@dataclass(frozen=True)
class ContainerTemplate:
    """How the Docker actuator starts one CPU node container.

    ``command`` items may use ``{name}``, ``{cores}`` and ``{memory_mb}``; every container gets
    ``labels`` plus ``tangram.pool`` and ``tangram.member``. To show up as replicas of a compose
    service, put ``com.docker.compose.project`` / ``com.docker.compose.service`` in ``labels``.
    """

    image: str
    command: tuple[str, ...] = ("tangram", "worker", "cpu", "--node", "{name}", "--cores",
                                "{cores}", "--memory-mb", "{memory_mb}")
    environment: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    network_mode: str = "host"
    stop_timeout_s: int = 30

    def argv(self, name: str, cores: int, memory_mb: float) -> list[str]:
        """The container's command for member ``name``."""
        return [part.format(name=name, cores=cores, memory_mb=f"{memory_mb:g}")
                for part in self.command]


class DockerActuator(MemberActuator):
    """CPU node workers as containers started with the ``docker`` SDK, labelled
    ``tangram.pool=cpu``; drained like local processes before they are stopped and removed."""

    def __init__(
        self, client: redis.Redis, docker_client: Any, template: ContainerTemplate, cores: int,
        memory_mb: float, prefix: str = "auto", drain_timeout_s: float = 600.0,
        clock: Callable[[], float] = time.time, *, registry: Registry | None = None,
        startup_grace_s: float = 30.0,
    ) -> None:
        super().__init__(client, cores, memory_mb, prefix, drain_timeout_s, clock,
                         registry=registry, startup_grace_s=startup_grace_s)
        self._docker = docker_client
        self.template = template

    def containers(self) -> list[Any]:
        """Every container of this actuator's prefix in the CPU pool, running or not."""
        return list(self._docker.containers.list(all=True, filters={"label": [
            f"tangram.pool={CPU_POOL}", f"tangram.prefix={self._prefix}"]}))

    def _start(self, name: str) -> Any:
        labels = {**self.template.labels, "tangram.pool": CPU_POOL, "tangram.member": name,
                  "tangram.prefix": self._prefix}
        return self._docker.containers.run(
            self.template.image, self.template.argv(name, self.cores, self.memory_mb),
            name=f"tangram-{name}", detach=True, labels=labels,
            environment=dict(self.template.environment), network_mode=self.template.network_mode,
            nano_cpus=self.cores * 1_000_000_000,
        )

    def _stop(self, handle: object) -> None:
        container: Any = handle
        with contextlib.suppress(docker_errors.NotFound):
            container.stop(timeout=self.template.stop_timeout_s)
            container.remove(force=True)

    def _exited(self, handle: object) -> bool:
        container: Any = handle
        try:
            container.reload()
        except docker_errors.NotFound:
            return True
        return str(container.status) in {"exited", "dead"}
