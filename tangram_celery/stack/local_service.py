"""A compose service as a local process: its command, environment and ports made local.

:func:`localize` turns the services of a :class:`~tangram_celery.stack.compose.ComposeFile` into
:class:`LocalService` entries: ``SERVICE:PORT`` becomes ``127.0.0.1`` and a host port, container
paths become local ones (volume directories, host paths, the source tree), a service's own listen
address becomes loopback, and ``tangram`` becomes ``python -m tangram_celery.cli`` of this
interpreter (what differs between a container and a local process is listed at the top of the
compose file).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tangram_celery.errors import ConfigError
from tangram_celery.stack.compose import ComposeFile, Healthcheck, Service

LOCAL_HOST = "127.0.0.1"
ANY_ADDRESS = "0.0.0.0"  # nosec B104 # the listen address written in the compose file, rewritten here to loopback


@dataclass(frozen=True)
class LocalService:
    """A service as a local process: its argv, the environment it adds, its healthcheck."""

    name: str
    argv: tuple[str, ...]
    environment: Mapping[str, str]
    healthcheck: Healthcheck | None
    depends_on: Mapping[str, str]
    ports: Mapping[int, int]
    restart: str
    stop_grace_s: float


def host_ports(compose: ComposeFile, names: Sequence[str]) -> dict[tuple[str, int], int]:
    """(service, container port) -> host port, for every port the services expose or publish:
    the published one, else the container port itself."""
    found: dict[tuple[str, int], int] = {}
    for name in names:
        service = compose.services[name]
        for port in (*service.expose, *service.ports):
            found[(name, port)] = service.ports.get(port, port)
    return found


def local_paths(compose: ComposeFile, service: Service, volume_dir: Path) -> dict[str, str]:
    """Container path -> local path: the service's volumes and ``x-tangram-up.app_dir``."""
    paths: dict[str, str] = {}
    if compose.app_dir and compose.source:
        paths[compose.app_dir] = str(compose.source)
    for volume in service.volumes:
        if volume.named:
            paths[volume.target] = str(volume_dir / volume.source)
        else:
            paths[volume.target] = os.path.normpath(compose.directory / volume.source)
    return paths


def rewrite(value: str, addresses: Mapping[str, str], paths: Mapping[str, str]) -> str:
    """``SERVICE:PORT`` -> local ``HOST:PORT``; container paths -> local paths (where a path
    starts: at the start, after ``=``, ``:`` or ``/``, and up to ``/`` or the end)."""
    for remote, local in addresses.items():
        value = re.sub(rf"(?<![\w.-]){re.escape(remote)}(?!\d)", local, value)
    for inside, outside in sorted(paths.items(), key=lambda item: -len(item[0])):
        value = re.sub(rf"(?<![^=:/]){re.escape(inside)}(?=/|$)",
                       outside.replace("\\", "\\\\"), value)
    return value


def own_listener(token: str, ports: Mapping[int, int]) -> str:
    """A service's own listen address or port in its command, made local."""
    if token == ANY_ADDRESS:
        return LOCAL_HOST
    flag, sep, value = token.rpartition("=")
    if value.isdigit() and int(value) in ports:
        return f"{flag}{sep}{ports[int(value)]}"
    return token


def executable(argv: Sequence[str], python: str = sys.executable) -> list[str]:
    """The local command of a container command: ``tangram`` is this interpreter's CLI,
    ``python``/``python3`` this interpreter, anything else a program on ``PATH``."""
    if not argv:
        raise ConfigError("a service without a command cannot run as a local process")
    head, rest = argv[0], list(argv[1:])
    if head == "tangram":
        return [python, "-m", "tangram_celery.cli", *rest]
    if head in ("python", "python3"):
        return [python, *rest]
    found = shutil.which(head)
    if found is None:
        raise ConfigError(f"{head!r} is not installed here")
    return [found, *rest]


def localize(
    compose: ComposeFile, names: Sequence[str], ports: Mapping[tuple[str, int], int],
    volume_dir: Path, python: str = sys.executable,
) -> dict[str, LocalService]:
    """The local form of each named service (see the compose file's header for the rules)."""
    addresses = {f"{svc}:{port}": f"{LOCAL_HOST}:{local}" for (svc, port), local in ports.items()}
    local: dict[str, LocalService] = {}
    for name in names:
        service = compose.services[name]
        own = {port: host for (svc, port), host in ports.items() if svc == name}
        paths = local_paths(compose, service, volume_dir)

        def convert(tokens: Sequence[str], own: Mapping[int, int] = own,
                    paths: Mapping[str, str] = paths) -> list[str]:
            return [own_listener(rewrite(t, addresses, paths), own) for t in tokens]

        check = service.healthcheck
        if check is not None:
            check = Healthcheck(tuple(executable(convert(check.test), python)), check.interval_s,
                                check.timeout_s, check.retries, check.start_period_s)
        local[name] = LocalService(
            name=name,
            argv=tuple(executable(convert(service.command), python)),
            environment={k: rewrite(v, addresses, paths) for k, v in service.environment.items()},
            healthcheck=check,
            depends_on=service.depends_on,
            ports=own,
            restart=service.restart,
            stop_grace_s=service.stop_grace_s,
        )
    return local
