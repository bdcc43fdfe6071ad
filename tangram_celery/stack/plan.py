"""The plan of a local stack: which compose services run here, how, and what a client needs.

:func:`plan` reads the compose file for a set of :class:`UpOptions`: the interpolation
variables (the env file, the environment over it, passwords generated and kept in
``secrets.env`` when unset), the services selected with their dependencies, less those not of
tangram's image, their host ports (checked free), their local form, and copies of a service
where asked; :func:`client_settings` is what a client on this host reads from it.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import quote

from tangram_celery.errors import ConfigError
from tangram_celery.processes import free_ports
from tangram_celery.stack.compose import (
    DEFAULT_COMPOSE_FILE,
    ComposeFile,
    load_compose,
    read_env_file,
    selected_services,
)
from tangram_celery.stack.local_service import LOCAL_HOST, LocalService, host_ports, localize

DEFAULT_STATE_DIR = Path.home() / ".local" / "state" / "tangram" / "up"
CLIENT_SETTINGS = ("TANGRAM_REDIS_URL", "TANGRAM_RESULT_URL", "TANGRAM_TRITON_URL",
                   "TANGRAM_GATEWAY_TOKEN", "TANGRAM_REDIS_SENTINEL_PASSWORD")
GATEWAY_URL = "SANDBOX_FUSION_URL"
GATEWAY_PORT = 8080
"""The gateway's port in the compose file; its published host port goes in the URL."""
GENERATED_SECRETS = ("STACK_REDIS_PASSWORD", "TANGRAM_FLOWER_PASSWORD", "TANGRAM_GATEWAY_TOKEN",
                     "TANGRAM_TRITON_KEY")
HA_SECRETS = ("STACK_SENTINEL_PASSWORD",)
HA_PROFILE = "ha"
HA_SERVICES = ("redis", "redis-replica", "sentinel-1", "sentinel-2", "sentinel-3")
HA_VARIABLES = {"STACK_REDIS_SCHEME": "sentinel",
                "STACK_REDIS_HOSTS": "sentinel-1:26379,sentinel-2:26379,sentinel-3:26379"}
"""What ``tangram up --ha`` sets: the compose file's ``ha`` profile (a replica and three
Sentinels beside the primary) and every service's broker URL on the Sentinels."""


def port_is_free(port: int, host: str = LOCAL_HOST) -> bool:
    """Whether ``host:port`` can be listened on now."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def is_ours(image: str) -> bool:
    """Whether a service runs tangram's image (so its command is one of ours)."""
    return image.startswith("tangram:") or image.split("/")[-1].startswith("tangram:")


def write_private(path: Path, values: Mapping[str, str]) -> None:
    """Write ``KEY=VALUE`` lines readable by the owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.writelines(f"{key}={value}\n" for key, value in values.items())


def stack_variables(
    environ: Mapping[str, str], env_file: Mapping[str, str], secrets_path: Path, sandbox: str,
    generated: Sequence[str] = GENERATED_SECRETS,
) -> dict[str, str]:
    """The interpolation variables of ``tangram up``: the env file, then the environment over
    it (compose's precedence), the sandbox backend, and passwords generated (and kept in
    ``secrets_path``) for those still unset."""
    variables = {**env_file, **environ, "STACK_SANDBOX_BACKEND": sandbox}
    kept = read_env_file(secrets_path)
    missing = {name: kept.get(name) or secrets.token_urlsafe(24)
               for name in generated if not variables.get(name)}
    if missing:
        write_private(secrets_path, {**kept, **missing})
    return {**variables, **missing}



@dataclass(frozen=True)
class UpOptions:
    """What ``tangram up`` runs (see :func:`~tangram_celery.stack.up.add_up_arguments`).

    ``publish=False``: every port a service listens on is a free loopback port instead of the
    host port the compose file publishes (a private stack beside another one). ``replicas``:
    service -> one mapping of interpolation variables per copy to run; copy ``i`` (from 1) is
    named ``SERVICE-i`` and its command is read from the compose file with those variables
    over the others (how ``tangram demo`` runs several CPU nodes from one ``cpu-node``)."""

    compose_file: Path = DEFAULT_COMPOSE_FILE
    env_file: Path | None = None
    state_dir: Path = DEFAULT_STATE_DIR
    services: tuple[str, ...] = ()
    profiles: tuple[str, ...] = ()
    sandbox: str = "bwrap"
    publish: bool = True
    replicas: Mapping[str, Sequence[Mapping[str, str]]] = field(default_factory=dict)
    ha: bool = False


def plan(options: UpOptions, environ: Mapping[str, str]
         ) -> tuple[ComposeFile, dict[str, LocalService], list[str], dict[str, str]]:
    """Read the compose file for ``options``: (compose file, local services in start order,
    skipped services, the environment every process starts with)."""
    env_path = options.env_file or options.compose_file.parent / ".env"
    env_file = read_env_file(env_path)
    generated = (*GENERATED_SECRETS, *HA_SECRETS) if options.ha else GENERATED_SECRETS
    variables = stack_variables(environ, env_file, options.state_dir / "secrets.env",
                                options.sandbox, generated)
    profiles, named = options.profiles, options.services
    if options.ha:
        variables.update(HA_VARIABLES)
        profiles = (*profiles, HA_PROFILE)
        named = (*named, *(n for n in HA_SERVICES if n not in named)) if named else ()
    compose = load_compose(options.compose_file, variables)
    order = selected_services(compose, named, profiles)
    skipped = [n for n in order if not is_ours(compose.services[n].image)]
    order = [n for n in order if n not in skipped]
    ports = host_ports(compose, order)
    if not options.publish:
        ports = dict(zip(ports, free_ports(len(ports)), strict=True))
    taken = [f"{svc}:{port} -> {LOCAL_HOST}:{host}" for (svc, port), host in ports.items()
             if not port_is_free(host)]
    if taken:
        raise ConfigError("ports in use: " + "; ".join(taken) + " (stop what listens there, "
                          "or choose other ports with the STACK_*_PORT variables)")
    local = localize(compose, order, ports, options.state_dir / "volumes")
    local = {name: local[name] for name in order}
    for name, copies in options.replicas.items():
        local = replicate(local, name, [
            localize(load_compose(options.compose_file, {**variables, **extra}), [name], ports,
                     options.state_dir / "volumes")[name]
            for extra in copies
        ])
    base_env = {**environ, **env_file, **{k: variables[k] for k in generated}}
    return compose, local, skipped, base_env


def replicate(services: Mapping[str, LocalService], name: str,
              copies: Sequence[LocalService]) -> dict[str, LocalService]:
    """``services`` with ``name`` replaced, in place, by ``copies`` named ``NAME-1``, ``NAME-2``
    ...; a service that depends on ``name`` depends on every copy. Raises :class:`ConfigError`
    when ``name`` is not started or listens on ports (its copies would share them)."""
    if name not in services:
        raise ConfigError(f"cannot run copies of {name!r}: it is not among the services "
                          f"started ({', '.join(services)})")
    if services[name].ports:
        raise ConfigError(f"cannot run copies of {name!r}: it listens on ports")
    if not copies:
        raise ConfigError(f"{name!r}: at least one copy is needed")
    named = {f"{name}-{i}": replace(copy, name=f"{name}-{i}")
             for i, copy in enumerate(copies, 1)}
    result: dict[str, LocalService] = {}
    for key, service in services.items():
        if key == name:
            result.update(named)
            continue
        needs = dict(service.depends_on)
        if name in needs:
            condition = needs.pop(name)
            needs.update(dict.fromkeys(named, condition))
            service = replace(service, depends_on=needs)
        result[key] = service
    return result


def client_settings(services: Mapping[str, LocalService]) -> dict[str, str]:
    """The ``TANGRAM_`` settings a client on this host uses to reach the local stack, and
    ``SANDBOX_FUSION_URL``: the gateway's ``/run_code`` with ``?token=``, as verl's
    ``sandbox_fusion.url`` (and its tests) take it."""
    found: dict[str, str] = {}
    for service in services.values():
        for key in CLIENT_SETTINGS:
            if key in service.environment:
                found.setdefault(key, service.environment[key])
    gateway = services.get("gateway")
    if gateway is not None and GATEWAY_PORT in gateway.ports:
        url = f"http://{LOCAL_HOST}:{gateway.ports[GATEWAY_PORT]}/run_code"
        token = gateway.environment.get("TANGRAM_GATEWAY_TOKEN", "")
        found[GATEWAY_URL] = f"{url}?token={quote(token, safe='')}" if token else url
    return found
