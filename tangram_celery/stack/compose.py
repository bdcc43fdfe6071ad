"""The compose file as data: parsing, variable interpolation, service order (pure, no I/O
beyond reading the files named).

``tangram up`` (:mod:`tangram_celery.stack.up`) runs the services of ``compose/docker-compose.yml``
as local processes. This module reads that file as ``docker-compose`` would: ``${VAR}``,
``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?error}``, ``${VAR?error}``, ``${VAR:+alt}``
and ``$$`` in every string value, services with ``profiles`` only when a profile is active or
they are named, ``depends_on`` as a list or with conditions, durations such as ``2s`` or
``1m30s``. :mod:`tangram_celery.stack.local_service` turns its services into local processes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tangram_celery.errors import ConfigError

DEFAULT_COMPOSE_FILE = Path(__file__).resolve().parents[2] / "compose" / "docker-compose.yml"
_VARIABLE = re.compile(r"\$(?:(?P<dollar>\$)|\{(?P<braced>[^}]*)\}|(?P<named>[A-Za-z_]\w*))")
_BRACED = re.compile(r"(?P<name>[A-Za-z_]\w*)(?:(?P<op>:?[-?+])(?P<arg>.*))?\Z", re.DOTALL)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)")
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
RESTART_POLICIES = ("no", "always", "on-failure", "unless-stopped")


def interpolate(text: str, variables: Mapping[str, str], where: str = "") -> str:
    """Substitute compose variables in ``text``; raises :class:`ConfigError` for ``:?`` and
    ``?`` forms whose variable is unset (or empty, for ``:?``) and for malformed references."""

    def substitute(match: re.Match[str]) -> str:
        if match.group("dollar"):
            return "$"
        if match.group("named"):
            return variables.get(match.group("named"), "")
        parsed = _BRACED.match(match.group("braced"))
        if parsed is None:
            raise ConfigError(f"{where}: malformed variable reference {match.group(0)!r}")
        name, op, arg = parsed.group("name"), parsed.group("op"), parsed.group("arg") or ""
        value = variables.get(name)
        empty = not value
        if op in (":-", "-"):
            return arg if (value is None or (op == ":-" and empty)) else str(value)
        if op in (":?", "?"):
            if value is None or (op == ":?" and empty):
                raise ConfigError(f"{where}: {arg or f'{name} is not set'}")
            return str(value)
        if op in (":+", "+"):
            return arg if (value is not None and not (op == ":+" and empty)) else ""
        return value or ""

    return _VARIABLE.sub(substitute, text)


def interpolate_tree(node: Any, variables: Mapping[str, str], where: str = "") -> Any:
    """:func:`interpolate` every string value (not the keys) of a parsed YAML tree."""
    if isinstance(node, str):
        return interpolate(node, variables, where)
    if isinstance(node, list):
        return [interpolate_tree(item, variables, where) for item in node]
    if isinstance(node, dict):
        return {key: interpolate_tree(value, variables, f"{where}.{key}" if where else str(key))
                for key, value in node.items()}
    return node


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines of an env file (``#`` comments, blank lines and one pair of
    surrounding quotes allowed); a missing file reads as empty."""
    values: dict[str, str] = {}
    if not path.is_file():
        return values
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.removeprefix("export ").partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_]\w*", key.strip()):
            raise ConfigError(f"{path}:{number}: expected KEY=VALUE, got {raw!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def parse_duration(raw: str | int | float | None, default: float) -> float:
    """Seconds of a compose duration (``"1m30s"``, ``"500ms"``, ``"2s"``, a number)."""
    if raw is None:
        return default
    if isinstance(raw, int | float):
        return float(raw)
    parts = _DURATION.findall(raw.strip())
    if not parts or "".join(a + u for a, u in parts) != raw.strip():
        raise ConfigError(f"{raw!r} is not a duration such as 2s, 500ms or 1m30s")
    return sum(float(amount) * _UNITS[unit] for amount, unit in parts)


@dataclass(frozen=True)
class Healthcheck:
    """A service's healthcheck (``CMD`` form: argv)."""

    test: tuple[str, ...]
    interval_s: float = 30.0
    timeout_s: float = 30.0
    retries: int = 3
    start_period_s: float = 0.0

    @property
    def deadline_s(self) -> float:
        """How long a starting service may take to become healthy."""
        return self.start_period_s + self.retries * (self.interval_s + self.timeout_s)


@dataclass(frozen=True)
class Volume:
    """One volume mount: a named volume (``named``) or a host path, at ``target``."""

    source: str
    target: str
    named: bool


@dataclass(frozen=True)
class Service:
    """One service of the compose file, interpolated."""

    name: str
    image: str
    command: tuple[str, ...]
    environment: Mapping[str, str] = field(default_factory=dict)
    env_files: tuple[str, ...] = ()
    depends_on: Mapping[str, str] = field(default_factory=dict)
    healthcheck: Healthcheck | None = None
    expose: tuple[int, ...] = ()
    ports: Mapping[int, int] = field(default_factory=dict)
    volumes: tuple[Volume, ...] = ()
    profiles: tuple[str, ...] = ()
    restart: str = "no"
    stop_grace_s: float = 10.0


@dataclass(frozen=True)
class ComposeFile:
    """The services of a compose file and its ``x-tangram-up`` block."""

    path: Path
    services: Mapping[str, Service]
    app_dir: str | None = None
    source: Path | None = None

    @property
    def directory(self) -> Path:
        """The project directory: relative paths in the file start here."""
        return self.path.parent


def _mapping(raw: Any, where: str) -> dict[str, str]:
    if raw is None:
        return {}
    if isinstance(raw, list):
        pairs = [str(item).partition("=") for item in raw]
        return {key: value for key, _, value in pairs}
    if isinstance(raw, dict):
        return {str(k): "" if v is None else str(v) for k, v in raw.items()}
    raise ConfigError(f"{where}: expected a mapping or a list of KEY=VALUE")


def _argv(raw: Any, where: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, list):
        return tuple(str(item) for item in raw)
    raise ConfigError(f"{where}: write it in exec form, a list of arguments")


def _depends(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if isinstance(raw, list):
        return {str(name): "service_started" for name in raw}
    return {str(name): str((spec or {}).get("condition", "service_started"))
            for name, spec in raw.items()}


def _healthcheck(raw: Any, where: str) -> Healthcheck | None:
    if not raw or raw.get("disable"):
        return None
    test = _argv(raw.get("test"), f"{where}.healthcheck.test")
    if not test or test[0] not in ("CMD", "CMD-SHELL", "NONE"):
        raise ConfigError(f"{where}.healthcheck.test: expected [\"CMD\", ...]")
    if test[0] == "NONE":
        return None
    test = ("/bin/sh", "-c", " ".join(test[1:])) if test[0] == "CMD-SHELL" else test[1:]
    return Healthcheck(
        test=test,
        interval_s=parse_duration(raw.get("interval"), 30.0),
        timeout_s=parse_duration(raw.get("timeout"), 30.0),
        retries=int(raw.get("retries", 3)),
        start_period_s=parse_duration(raw.get("start_period"), 0.0),
    )


def _ports(raw: Any, where: str) -> dict[int, int]:
    published: dict[int, int] = {}
    for entry in raw or []:
        if isinstance(entry, dict):
            target = int(entry["target"])
            published[target] = int(entry.get("published") or target)
            continue
        parts = str(entry).split("/")[0].split(":")
        if len(parts) == 1:
            continue  # container port only: published on a random host port
        try:
            published[int(parts[-1])] = int(parts[-2])
        except ValueError:
            raise ConfigError(f"{where}.ports: cannot read {entry!r}") from None
    return published


def _volumes(raw: Any, where: str) -> tuple[Volume, ...]:
    found = []
    for entry in raw or []:
        if isinstance(entry, dict):
            source, target = str(entry.get("source", "")), str(entry["target"])
            named = entry.get("type", "volume") == "volume"
        else:
            parts = str(entry).split(":")
            if len(parts) < 2:
                raise ConfigError(f"{where}.volumes: anonymous volume {entry!r} is not supported")
            source, target = parts[0], parts[1]
            named = not source.startswith((".", "/", "~"))
        found.append(Volume(source, target, named))
    return tuple(found)


def parse_service(name: str, raw: Mapping[str, Any]) -> Service:
    """One interpolated ``services`` entry as a :class:`Service`."""
    where = f"services.{name}"
    env_files = raw.get("env_file") or ()
    restart = str(raw.get("restart", "no"))
    if restart.split(":")[0] not in RESTART_POLICIES:
        raise ConfigError(f"{where}.restart: {restart!r} is not one of {RESTART_POLICIES}")
    expose = tuple(int(str(port).split("/")[0]) for port in raw.get("expose") or ())
    return Service(
        name=name,
        image=str(raw.get("image", "")),
        command=_argv(raw.get("command"), f"{where}.command"),
        environment=_mapping(raw.get("environment"), f"{where}.environment"),
        env_files=(env_files,) if isinstance(env_files, str) else tuple(env_files),
        depends_on=_depends(raw.get("depends_on")),
        healthcheck=_healthcheck(raw.get("healthcheck"), where),
        expose=expose,
        ports=_ports(raw.get("ports"), where),
        volumes=_volumes(raw.get("volumes"), where),
        profiles=tuple(raw.get("profiles") or ()),
        restart=restart,
        stop_grace_s=parse_duration(raw.get("stop_grace_period"), 10.0),
    )


def load_compose(path: Path, variables: Mapping[str, str]) -> ComposeFile:
    """Read, interpolate and check a compose file."""
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read the compose file {path}: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("services"), dict):
        raise ConfigError(f"{path}: no services")
    services = {
        name: parse_service(name, interpolate_tree(raw or {}, variables, f"services.{name}"))
        for name, raw in document["services"].items()
    }
    for service in services.values():
        unknown = set(service.depends_on) - set(services)
        if unknown:
            raise ConfigError(f"services.{service.name}.depends_on: no service "
                              f"{', '.join(sorted(unknown))}")
    local = document.get("x-tangram-up") or {}
    source = local.get("source")
    return ComposeFile(path=path, services=services, app_dir=local.get("app_dir"),
                       source=(path.parent / source).resolve() if source else None)


def selected_services(
    compose: ComposeFile, names: Sequence[str] = (), profiles: Sequence[str] = (),
) -> list[str]:
    """The services to start, dependencies first: ``names`` (default: every service without a
    profile or with an active one) and everything they depend on."""
    for name in names:
        if name not in compose.services:
            raise ConfigError(f"no service {name!r} in {compose.path}; services: "
                              + ", ".join(compose.services))
    wanted = list(names) or [
        s.name for s in compose.services.values()
        if not s.profiles or set(s.profiles) & set(profiles)
    ]
    order: list[str] = []
    visiting: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        if name in visiting:
            raise ConfigError(f"dependency cycle: {' -> '.join([*visiting, name])}")
        visiting.append(name)
        for dependency in compose.services[name].depends_on:
            visit(dependency)
        visiting.pop()
        order.append(name)

    for name in wanted:
        visit(name)
    return order
