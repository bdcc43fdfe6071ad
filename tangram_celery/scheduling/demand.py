"""Predicted demand on a pool: how fast short and elastic work arrives, and how much it needs.

`Demand` is the plain-data forecast the robust policy (`robust`) reads; `DemandTracker` builds
it online from the scheduling points it is shown, the way `DurationModel` learns durations.

Each waiting job is counted once, when it is first seen, in one of three classes (`job_class`):

* ``short``: inelastic (admitted at its minimum) with a known expected duration of at most
  `short_s` seconds at that minimum;
* ``elastic``: the scheduler may give it more than its minimum (`Job.is_elastic`);
* ``long``: everything else (inelastic and long, or of unknown duration).

Arrival rates are exponentially decayed counts with time constant `window_s` (bias-corrected
while less than that has passed since the first arrival). A short job adds its expected
duration (times its units) to the short work; an elastic job adds its *time curve*: for every
cap k, its expected duration when limited to its largest allowed count <= k (its minimum if
none), averaged over the last `samples` elastic jobs.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from tangram_celery.scheduling.types import Job, Snapshot

JobClass = Literal["short", "elastic", "long"]


@dataclass(frozen=True)
class DemandConfig:
    """Settings of `DemandTracker`: the short threshold, the rate window, the sample size.

    `short_s` = 60 s: on the simulated AI-coding workload, counting every inelastic action of
    up to a minute as short (so none waits behind the reserve) gave both the lowest mean ACT
    and the lowest exec ACT of 10 s, 60 s and no limit (`tangram bench robustness`)."""

    short_s: float = 60.0
    window_s: float = 10.0
    samples: int = 64

    def __post_init__(self) -> None:
        if not (self.short_s > 0 and self.window_s > 0 and self.samples >= 1):
            raise ValueError("short_s and window_s must be positive, samples at least 1")


@dataclass(frozen=True)
class Demand:
    """The forecast for one pool.

    `elastic_rate`: elastic arrivals per second. `elastic_time[k - 1]`: mean expected duration
    of an elastic job capped at k units (k = 1..the pool's units). `short_load`: mean units
    busy with short jobs (arrival rate times mean unit-seconds). `long_load`: the same for
    long jobs.
    """

    elastic_rate: float = 0.0
    elastic_time: tuple[float, ...] = ()
    short_load: float = 0.0
    long_load: float = 0.0


NO_DEMAND = Demand()
"""What a pool never seen before is forecast to need: nothing."""


def job_class(job: Job, short_s: float) -> JobClass:
    """The class a job is counted and treated in (see the module docstring)."""
    if job.is_elastic:
        return "elastic"
    duration = job.options[0][1]
    return "short" if duration is not None and duration <= short_s else "long"


def time_curve(job: Job, width: int) -> npt.NDArray[np.float64]:
    """The job's expected duration for caps 1..width: at its largest count <= the cap (its
    minimum if none)."""
    units, durations = job.option_arrays
    index = np.maximum(np.searchsorted(units, np.arange(1, width + 1), side="right") - 1, 0)
    return np.asarray(durations[index], dtype=np.float64)


@dataclass
class Rate:
    """An exponentially decayed arrival count with its own clock."""

    window_s: float
    count: float = 0.0
    last: float | None = None
    first: float | None = None

    def add(self, now: float, amount: float = 1.0) -> None:
        """Count `amount` arrivals at `now`."""
        self.count = self.at(now) + amount
        self.last = now
        self.first = now if self.first is None else self.first

    def at(self, now: float) -> float:
        """The decayed count at `now`."""
        if self.last is None:
            return 0.0
        return self.count * math.exp(-max(now - self.last, 0.0) / self.window_s)

    def per_second(self, now: float) -> float:
        """Arrivals per second, corrected for a window not yet filled (counting at least one
        window, so a first arrival does not read as a burst)."""
        if self.first is None:
            return 0.0
        filled = 1.0 - math.exp(-max(now - self.first, self.window_s) / self.window_s)
        return self.at(now) / (self.window_s * filled)


@dataclass
class PoolDemand:
    """What `DemandTracker` remembers of one pool."""

    config: DemandConfig
    width: int
    seen: set[str] = field(default_factory=set)
    rates: dict[JobClass, Rate] = field(default_factory=dict)
    work: dict[JobClass, Rate] = field(default_factory=dict)
    curves: deque[npt.NDArray[np.float64]] = field(default_factory=deque)
    total: npt.NDArray[np.float64] | None = None

    def observe(self, jobs: list[Job], now: float) -> None:
        """Count the jobs not seen before; forget the ones no longer waiting."""
        current = {job.job_id for job in jobs}
        for job in jobs:
            if job.job_id not in self.seen:
                self._arrive(job, now)
        self.seen = current

    def _arrive(self, job: Job, now: float) -> None:
        kind = job_class(job, self.config.short_s)
        window = self.config.window_s
        self.rates.setdefault(kind, Rate(window)).add(now)
        duration = job.options[0][1]
        if kind != "elastic":
            held = job.options[0][0] * (duration or 0.0)
            self.work.setdefault(kind, Rate(window)).add(now, held)
            return
        curve = time_curve(job, self.width)
        self.curves.append(curve)
        self.total = curve.copy() if self.total is None else self.total + curve
        if len(self.curves) > self.config.samples:
            self.total -= self.curves.popleft()

    def forecast(self, now: float) -> Demand:
        """The pool's `Demand` at `now`."""
        rate = self.rates.get("elastic")
        mean = () if self.total is None else tuple((self.total / len(self.curves)).tolist())
        return Demand(
            rate.per_second(now) if rate else 0.0,
            mean,
            self._load("short", now),
            self._load("long", now),
        )

    def _load(self, kind: JobClass, now: float) -> float:
        work = self.work.get(kind)
        return work.per_second(now) if work else 0.0


class DemandTracker:
    """Learns each pool's `Demand` from the scheduling points it observes (stateful).

    `observe(snapshot)` counts every waiting job the first time it appears and returns the
    forecast of every pool of the snapshot.
    """

    def __init__(self, config: DemandConfig | None = None) -> None:
        self.config = config or DemandConfig()
        self._pools: dict[str, PoolDemand] = {}

    def observe(self, snapshot: Snapshot) -> dict[str, Demand]:
        """Count new arrivals and return the forecast per pool name."""
        by_key: dict[str, list[Job]] = {pool.name: [] for pool in snapshot.pools}
        for job in snapshot.waiting:
            by_key.setdefault(job.key, []).append(job)
        forecasts = {}
        for pool in snapshot.pools:
            tracked = self._pools.get(pool.name)
            if tracked is None:
                tracked = self._pools[pool.name] = PoolDemand(self.config, pool.total)
            tracked.observe(by_key[pool.name], snapshot.now)
            forecasts[pool.name] = tracked.forecast(snapshot.now)
        return forecasts
