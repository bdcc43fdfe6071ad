"""The :class:`Settings` object: its sections, reading it from the environment, and changing it."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from tangram_celery.errors import ConfigError
from tangram_celery.settings.field import PREFIX
from tangram_celery.settings.runtime import (
    ActionSettings,
    BrokerSettings,
    ClientSettings,
    NodeSettings,
    SandboxSettings,
)
from tangram_celery.settings.services import (
    ApiSettings,
    AutoscaleSettings,
    GatewaySettings,
    GpuSettings,
    ObserveSettings,
    TritonSettings,
)


@dataclass(frozen=True)
class Settings:
    """Every tunable of tangram-celery, in sections; each field reads one ``TANGRAM_``
    variable (see the module docstring)."""

    broker: BrokerSettings = field(default_factory=BrokerSettings)
    actions: ActionSettings = field(default_factory=ActionSettings)
    client: ClientSettings = field(default_factory=ClientSettings)
    sandbox: SandboxSettings = field(default_factory=SandboxSettings)
    node: NodeSettings = field(default_factory=NodeSettings)
    triton: TritonSettings = field(default_factory=TritonSettings)
    gpu: GpuSettings = field(default_factory=GpuSettings)
    api: ApiSettings = field(default_factory=ApiSettings)
    gateway: GatewaySettings = field(default_factory=GatewaySettings)
    autoscale: AutoscaleSettings = field(default_factory=AutoscaleSettings)
    observe: ObserveSettings = field(default_factory=ObserveSettings)

    @property
    def visibility_timeout_s(self) -> int:
        """Redis visibility timeout: the longest allowed action plus a margin for its wait in a
        node's admission window, so a running action is never delivered twice (celery#5935)."""
        return int(self.actions.max_timeout_s + self.broker.visibility_margin_s)

    @property
    def restore_interval_s(self) -> int:
        """How often workers sweep for messages of dead workers to deliver again."""
        return max(1, min(10, self.visibility_timeout_s // 4))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read every field from its variable in ``env`` (default: ``os.environ``), then apply
        ``overrides`` (keyed by variable name without the prefix, lower case).

        Unknown ``TANGRAM_`` variables raise :class:`ConfigError`, so a typo is never silent.
        """
        source = dict(os.environ if env is None else env)
        unknown = sorted(k for k in source if k.startswith(PREFIX) and k not in _IGNORED
                         and k[len(PREFIX):].lower() not in VARIABLES)
        if unknown:
            raise ConfigError(
                f"unknown setting(s) {', '.join(unknown)}; known: "
                + ", ".join(PREFIX + n.upper() for n in sorted(VARIABLES)))
        values = {key: _parse(key, source[PREFIX + key.upper()])
                  for key in VARIABLES if PREFIX + key.upper() in source}
        return cls().with_(**{**values, **overrides})

    def with_(self, **changes: Any) -> Settings:
        """A copy with some variables changed (keyed as in :meth:`from_env`), checked again."""
        bad = sorted(set(changes) - set(VARIABLES))
        if bad:
            raise ConfigError(f"unknown setting(s) {', '.join(bad)}: name a TANGRAM_ variable "
                              "without its prefix, in lower case (e.g. redis_url)")
        by_section: dict[str, dict[str, Any]] = {}
        for key, value in changes.items():
            section, name = VARIABLES[key]
            by_section.setdefault(section, {})[name] = value
        new = replace(self, **{section: replace(getattr(self, section), **values)
                               for section, values in by_section.items()})
        new.check()
        return new

    def check(self) -> None:
        """Raise :class:`ConfigError` if a value, or a combination of values, is unusable."""
        for section in SECTIONS:
            getattr(self, section).check()
        stranded, ttl = self.client.stranded_after_s, self.node.ttl_s
        if stranded and stranded < ttl:
            raise ConfigError(f"{PREFIX}STRANDED_AFTER_S={stranded:g} must be 0 (off) or at "
                              f"least {PREFIX}NODE_TTL_S={ttl:g}")


def _parse_bool(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError("expected true/false")


def _parse_tuple(raw: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in raw.split(",") if part.strip())


_IGNORED = {"TANGRAM_UNITS"}
_BY_TYPE: dict[str, Callable[[str], Any]] = {
    "str": str, "Path": Path, "int": int, "float": float, "bool": _parse_bool,
    "tuple[str, ...]": _parse_tuple,
}
SECTIONS: tuple[str, ...] = tuple(f.name for f in fields(Settings))
"""The sections of :class:`Settings`, in order."""


def section_fields(section: str) -> tuple[Field[Any], ...]:
    """The fields of one section of :class:`Settings`."""
    return fields(getattr(Settings(), section))


VARIABLES: dict[str, tuple[str, str]] = {
    str(f.metadata["env"]).lower(): (section, f.name)
    for section in SECTIONS for f in section_fields(section)
}
"""Each variable (without the prefix, lower case) -> (section, field)."""
_PARSERS: dict[str, Callable[[str], Any]] = {
    str(f.metadata["env"]).lower(): _BY_TYPE[str(f.type)]
    for section in SECTIONS for f in section_fields(section)
}


def variable(key: str) -> str:
    """The full variable name of a settings key (``redis_url`` -> ``TANGRAM_REDIS_URL``)."""
    return PREFIX + key.upper()


def _parse(key: str, raw: str) -> Any:
    try:
        return _PARSERS[key](raw)
    except ValueError as exc:
        raise ConfigError(f"{variable(key)}={raw!r}: {exc}") from None
