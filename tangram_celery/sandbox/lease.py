"""One-request trajectories on any backend: a recycled sandbox where the backend keeps them.

:func:`one_request` wraps the actions of a trajectory that lives for one request (a gateway
request without a trajectory name): on a backend with ``lease`` (the embedded one, see
:mod:`~tangram_celery.sandbox.bwrap.recycle`) they run in a recycled sandbox, wiped afterwards;
on another the trajectory is ended when the block ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from tangram_celery.sandbox.base import SandboxBackend


@contextlib.contextmanager
def one_request(backend: SandboxBackend, trajectory_id: str) -> Iterator[None]:
    """Run the block's actions of ``trajectory_id`` as a one-request trajectory."""
    lease: Any = getattr(backend, "lease", None)
    if callable(lease):
        with lease(trajectory_id):
            yield
        return
    try:
        yield
    finally:
        backend.end_trajectory(trajectory_id)
