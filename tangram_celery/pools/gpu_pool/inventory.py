"""What a GPU pool publishes about itself: its name and its inventory hash (``keys.gpu_pool``).

:mod:`tangram_celery.pools.inventory` reads the hash back.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from tangram_celery.errors import ConfigError
from tangram_celery.managers.gpu import Chunk

POOL_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def inventory_fields(
    gpus: int, free_gpus: int, worker: str, models: Sequence[str],
    residents: Sequence[tuple[str, Chunk]], now: float,
    decisions: tuple[int, float] = (0, 0.0),
) -> dict[str, str]:
    """The hash a GPU pool publishes about itself (``keys.gpu_pool``), as strings; with its
    scheduler's calls and wall seconds so far."""
    return {
        "gpus": str(gpus),
        "free_gpus": str(free_gpus),
        "heartbeat": repr(now),
        "worker": worker,
        "models": json.dumps(list(models)),
        "residents": json.dumps([{"model": m, "gpus": list(c)} for m, c in residents]),
        "decide_calls": str(decisions[0]),
        "decide_s": repr(decisions[1]),
    }


def check_pool_name(pool: str) -> str:
    """``pool`` if it is a valid pool name (1-64 of A-Z a-z 0-9 _ -), else :class:`ConfigError`."""
    if not POOL_PATTERN.fullmatch(pool):
        raise ConfigError(f"GPU pool name {pool!r}: use 1-64 characters of A-Z a-z 0-9 _ -")
    return pool
