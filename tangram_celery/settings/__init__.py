"""One frozen settings object in sections, read from ``TANGRAM_``-prefixed environment variables.

Nothing else in the project reads the environment: an entry point builds a :class:`Settings`
once (``from_env``) and hands each component the section it needs (``settings.sandbox``,
``settings.gateway``, ...). Building it opens no connection.

Sections group the fields; they never rename a variable. Each field names its variable
(:func:`setting`), so ``TANGRAM_SANDBOX_MEMORY_MB`` is ``settings.sandbox.memory_mb`` and
``TANGRAM_REDIS_URL`` is ``settings.broker.redis_url``. ``from_env(**overrides)`` and
``with_(**changes)`` take a variable's name without the prefix, in lower case
(``redis_url=...``, ``sandbox_root=...``). An unknown ``TANGRAM_`` variable is an error.

* :mod:`tangram_celery.settings.field`: :func:`setting` and the checks sections share.
* :mod:`tangram_celery.settings.runtime`: the broker, actions, client, sandbox and node sections.
* :mod:`tangram_celery.settings.services`: the Triton, GPU, API, gateway, autoscale and observe
  sections.
* :mod:`tangram_celery.settings.model`: :class:`Settings`, reading and changing it.

May import: the ground floor; of it, only ``errors``, since every part reads its settings.
"""

from __future__ import annotations

from tangram_celery.settings.field import PREFIX, setting
from tangram_celery.settings.model import (
    SECTIONS,
    VARIABLES,
    Settings,
    section_fields,
    variable,
)
from tangram_celery.settings.runtime import (
    SCHEDULERS,
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

__all__ = [
    "PREFIX", "SCHEDULERS", "SECTIONS", "VARIABLES", "ActionSettings", "ApiSettings",
    "AutoscaleSettings", "BrokerSettings", "ClientSettings", "GatewaySettings", "GpuSettings",
    "NodeSettings", "ObserveSettings", "SandboxSettings", "Settings", "TritonSettings",
    "section_fields", "setting", "variable",
]
