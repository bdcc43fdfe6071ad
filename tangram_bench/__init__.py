"""The test bench of tangram-celery: workloads, the simulator and the benchmark commands.

It ships in the same distribution as the product and is installed with the ``bench`` extra
(``pip install 'tangram-celery[bench]'``), which brings what only the bench needs (matplotlib).
``tangram bench ...`` reaches it through the ``tangram.commands`` entry point
(:func:`tangram_bench.cli.main`); the product never imports it. Each command module also runs
as ``python -m tangram_bench.<name>``.

May import: tangram_celery (any of its packages). Inside the bench, :mod:`tangram_bench.workloads`
imports nothing of the bench, :mod:`tangram_bench.sim` only the workloads, and the commands
anything of it.
"""

from __future__ import annotations

import importlib.util

EXTRA = "bench"
REQUIRES = ("matplotlib",)
"""Modules that only the ``bench`` extra installs."""


def missing_requirements() -> list[str]:
    """The modules of :data:`REQUIRES` that are not installed."""
    return [name for name in REQUIRES if importlib.util.find_spec(name) is None]


def install_hint() -> str:
    """What to run to install the bench."""
    return f"pip install 'tangram-celery[{EXTRA}]'"
