"""The CPU nodes' side of the shared duration log: :mod:`tangram_celery.pools.duration_sharing`,
which GPU pools share too (``keys.duration_log``)."""

from __future__ import annotations

from tangram_celery.pools.duration_sharing import Entry, SharedDurations, parse_entry

__all__ = ["Entry", "SharedDurations", "parse_entry"]
