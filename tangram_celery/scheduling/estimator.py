"""Online duration model: learns T1 and E(m) per job signature from finished jobs.

A signature is (kind, key): the action kind plus a key the submitter gives (a task or repo id).
For every unit count m a signature has run with, the model keeps a robust running estimate of
the log duration: an exponentially weighted mean (plain mean while warming up) whose inputs are
clipped to `clip` running spreads around it, so one stuck or instant run barely moves it.

Durations at unit counts never observed come from an Amdahl fit d(m) = a + b / m (a, b >= 0,
weighted least squares over the observed counts), which needs at least two distinct counts;
T1 = d(1) and E(m) = T1 / (m * d(m)) follow, and a, b >= 0 keeps 0 < E(m) <= 1. A signature
never seen, or seen at one count only, has unknown elasticity: `options` then gives a duration
for the observed count only and the scheduler admits the job at its minimum. Offline profiles
are seeded with `seed` (they count as `prior_weight` observations) and then refined.

The model has no I/O and no clock; `to_dict` / `from_dict` give a JSON-safe copy of its state.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tangram_celery.scheduling.types import Option

Signature = tuple[str, str]
"""(kind, key): what kind of action, and the submitter's key (task or repo id)."""

FORMAT_VERSION = 1


@dataclass(frozen=True)
class EstimatorConfig:
    """Settings of the duration model.

    `alpha`: EWMA weight of a new observation once warmed up (the first 1/alpha observations
    are averaged plainly). `clip`: inputs are clipped to mean +- clip * spread (log units).
    `initial_spread` / `min_spread`: the spread after one observation, and its floor.
    `prior_weight`: how many observations a seeded profile counts as.
    """

    alpha: float = 0.2
    clip: float = 3.0
    initial_spread: float = 0.5
    min_spread: float = 0.05
    prior_weight: float = 4.0

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise ValueError("alpha must lie in (0, 1]")
        if self.clip <= 0 or self.min_spread <= 0 or self.initial_spread <= 0:
            raise ValueError("clip and spreads must be positive")
        if self.prior_weight <= 0:
            raise ValueError("prior_weight must be positive")


@dataclass(frozen=True)
class LogStat:
    """Running estimate of log duration at one unit count: mean, spread, observation weight."""

    mean: float
    spread: float
    weight: float

    def updated(self, value: float, config: EstimatorConfig) -> LogStat:
        """The estimate after observing log duration `value`."""
        spread = max(self.spread, config.min_spread)
        low, high = self.mean - config.clip * spread, self.mean + config.clip * spread
        clipped = min(max(value, low), high)
        rate = max(config.alpha, 1.0 / (self.weight + 1.0))
        mean = self.mean + rate * (clipped - self.mean)
        spread = self.spread + rate * (abs(clipped - self.mean) - self.spread)
        return LogStat(mean, max(spread, config.min_spread), self.weight + 1.0)


class DurationModel:
    """Expected durations per (signature, unit count), learned online."""

    def __init__(self, config: EstimatorConfig | None = None) -> None:
        self.config = config or EstimatorConfig()
        self._stats: dict[Signature, dict[int, LogStat]] = {}

    def observe(self, signature: Signature, units: int, duration: float) -> None:
        """Learn from a finished job that ran `duration` seconds on `units` units."""
        if units < 1 or not duration > 0 or not math.isfinite(duration):
            return
        stats = self._stats.setdefault(signature, {})
        value = math.log(duration)
        current = stats.get(units)
        if current is None:
            stats[units] = LogStat(value, self.config.initial_spread, 1.0)
        else:
            stats[units] = current.updated(value, self.config)

    def seed(self, signature: Signature, units: int, duration: float) -> None:
        """Add an offline profile point; it counts as `prior_weight` observations."""
        if units < 1 or not duration > 0:
            raise ValueError("a profile needs units >= 1 and a positive duration")
        stats = self._stats.setdefault(signature, {})
        stats[units] = LogStat(
            math.log(duration), self.config.initial_spread, self.config.prior_weight
        )

    def seed_profile(
        self, signature: Signature, t1: float, efficiency: Mapping[int, float]
    ) -> None:
        """Seed T1 and E(m) for the given unit counts (duration T1 / (E(m) * m))."""
        self.seed(signature, 1, t1)
        for units, value in efficiency.items():
            if units != 1:
                self.seed(signature, units, t1 / (value * units))

    def observed(self, signature: Signature) -> tuple[int, ...]:
        """The unit counts the signature has been observed or seeded at, ascending."""
        return tuple(sorted(self._stats.get(signature, {})))

    def known(self, signature: Signature) -> bool:
        """Whether the signature has been observed or seeded."""
        return signature in self._stats

    def estimate(self, signature: Signature, units: int) -> float | None:
        """Expected duration at `units`, or None when it cannot be told."""
        stats = self._stats.get(signature)
        if not stats:
            return None
        if units in stats:
            return math.exp(stats[units].mean)
        fit = self._fit(stats)
        return None if fit is None else fit[0] + fit[1] / units

    def t1(self, signature: Signature) -> float | None:
        """Expected single-unit duration, or None when unknown."""
        return self.estimate(signature, 1)

    def efficiency(self, signature: Signature, units: int) -> float | None:
        """E(units) = T1 / (units * d(units)), clamped to (0, 1]; None when unknown."""
        t1, duration = self.t1(signature), self.estimate(signature, units)
        if t1 is None or duration is None:
            return None
        return min(1.0, t1 / (units * duration))

    def options(self, signature: Signature, allowed: Iterable[int]) -> tuple[Option, ...]:
        """`Job.options` for the allowed unit counts (None where the duration is unknown)."""
        return tuple((units, self.estimate(signature, units)) for units in sorted(set(allowed)))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe copy of the model's state."""
        entries = [
            {
                "kind": kind,
                "key": key,
                "points": [
                    {"units": u, "mean": s.mean, "spread": s.spread, "weight": s.weight}
                    for u, s in sorted(stats.items())
                ],
            }
            for (kind, key), stats in sorted(self._stats.items())
        ]
        return {"version": FORMAT_VERSION, "signatures": entries}

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], config: EstimatorConfig | None = None
    ) -> DurationModel:
        """Rebuild a model from `to_dict` output."""
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"unsupported duration model format {data.get('version')!r}")
        model = cls(config)
        for entry in data["signatures"]:
            signature = (str(entry["kind"]), str(entry["key"]))
            model._stats[signature] = {
                int(p["units"]): LogStat(float(p["mean"]), float(p["spread"]), float(p["weight"]))
                for p in entry["points"]
            }
        return model

    def _fit(self, stats: Mapping[int, LogStat]) -> tuple[float, float] | None:
        if len(stats) < 2:
            return None
        cap = 1.0 / self.config.alpha
        points = [(1.0 / u, math.exp(s.mean), min(s.weight, cap)) for u, s in stats.items()]
        return _amdahl(points)


def _amdahl(points: Iterable[tuple[float, float, float]]) -> tuple[float, float]:
    """Weighted least squares of y = a + b * x with a, b >= 0 over (x, y, weight) points."""
    sw = sx = sy = sxx = sxy = 0.0
    for x, y, w in points:
        sw += w
        sx += w * x
        sy += w * y
        sxx += w * x * x
        sxy += w * x * y
    det = sw * sxx - sx * sx
    a = (sy * sxx - sx * sxy) / det
    b = (sw * sxy - sx * sy) / det
    if b < 0:
        return sy / sw, 0.0
    if a < 0:
        return 0.0, sxy / sxx
    return a, b
