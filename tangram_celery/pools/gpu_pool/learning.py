"""What a GPU pool learns of its service times, and shares with the other GPU pools.

The pool learns each call's time per (model, DoP) from what it served, with the pure rules of
:mod:`tangram_celery.scheduling.service_times`; with a :class:`SharedDurations` it publishes what
it learns on the GPU pools' duration log (``keys.duration_log(keys.GPU)``) and reads the other
pools' entries on a sync thread, as CPU nodes do on theirs.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from tangram_celery.pools.duration_sharing import SharedDurations
from tangram_celery.pools.serving import Heartbeat
from tangram_celery.scheduling import DurationModel, Option
from tangram_celery.scheduling.learned import learn
from tangram_celery.scheduling.service_times import service_options, service_signature


class ServiceTimes:
    """One GPU pool's learned service times: its own ``model``, or ``shared``'s (then shared)."""

    def __init__(self, pool: str, model: DurationModel | None = None,
                 shared: SharedDurations | None = None) -> None:
        self.model = shared.model if shared is not None else model or DurationModel()
        self.shared = shared
        self._lock = threading.Lock() if shared is None else shared.lock
        self._sync = None if shared is None else Heartbeat(
            f"tangram-gpu-durations-{pool}", shared.every_s, self._catch_up)

    def start(self) -> None:
        """Start reading the other pools' entries (when shared)."""
        if self._sync is not None:
            self._sync.start()

    def stop(self) -> None:
        """Stop reading them."""
        if self._sync is not None:
            self._sync.stop()

    def _catch_up(self) -> None:
        if self.shared is not None:
            self.shared.catch_up()

    def options(self, model: str, signature: str, allowed: Sequence[int],
                elastic: bool) -> tuple[Option, ...]:
        """What a call of ``model`` that states no duration is expected to take
        (:func:`service_options`)."""
        with self._lock:
            return service_options(self.model, model, signature, allowed, elastic)

    def learn(self, model: str, signature: str, units: int, seconds: float) -> None:
        """A served call of ``model`` took ``seconds`` on ``units`` GPUs."""
        if not seconds > 0:
            return
        if self.shared is not None:
            self.shared.learn(service_signature(model, signature), units, seconds)
            return
        with self._lock:
            learn(self.model, service_signature(model, signature), units, seconds)
