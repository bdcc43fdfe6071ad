"""How a settings field names its variable, and the checks every section shares."""

from __future__ import annotations

from dataclasses import field, fields
from typing import Any, TypeVar

from tangram_celery.errors import ConfigError

PREFIX = "TANGRAM_"
T = TypeVar("T")


def setting(default: T, env: str) -> T:
    """A settings field read from ``TANGRAM_<env>``."""
    return field(default=default, metadata={"env": env})


def env_name(section: Any, name: str) -> str:
    """The variable (without the prefix) of field ``name`` of a section."""
    return str(next(f for f in fields(section) if f.name == name).metadata["env"])


def positive(section: Any, *names: str) -> None:
    """Raise :class:`ConfigError` unless each named field of ``section`` is above zero."""
    for name in names:
        if getattr(section, name) <= 0:
            raise ConfigError(f"{PREFIX}{env_name(section, name)} must be positive")
