"""The runner as files for an action: a sandbox's Python has pytest but not this package, so
the modules the plugin imports go in with the action (they need the standard library only)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

RUNNER_MODULES = (
    "tangram_celery", "tangram_celery.errors", "tangram_celery.sandbox",
    "tangram_celery.sandbox.base", "tangram_celery.sandbox.isolation",
    "tangram_celery.sandbox.output", "tangram_celery.sandbox.parallelism",
    "tangram_celery.sandbox.malleable", "tangram_celery.sandbox.malleable.command",
    "tangram_celery.sandbox.malleable.control", "tangram_celery.sandbox.malleable.controller",
    "tangram_celery.sandbox.malleable.plugin", "tangram_celery.sandbox.malleable.pool",
    "tangram_celery.sandbox.malleable.protocol", "tangram_celery.sandbox.malleable.resizer",
    "tangram_celery.sandbox.malleable.shipping", "tangram_celery.sandbox.malleable.worker",
)
"""Every module importing the plugin loads (a test keeps this list equal to what it loads)."""


def runner_files(prefix: str) -> dict[str, str]:
    """The source of :data:`RUNNER_MODULES` as action files under ``prefix``
    (``prefix/tangram_celery/...``); put ``/work/<prefix>`` on the action's ``PYTHONPATH``."""
    files = {}
    for name in RUNNER_MODULES:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise ModuleNotFoundError(f"the malleable runner needs {name}, which is missing")
        origin = Path(spec.origin)
        relative = Path(*name.split("."))
        relative = relative / origin.name if origin.name == "__init__.py" else \
            relative.with_suffix(".py")
        files[f"{prefix}/{relative.as_posix()}"] = origin.read_text()
    return files
