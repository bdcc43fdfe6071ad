"""What the pooled systems' policies are told an action will take: learned, exact or noisy.

* ``learned`` (the default): each pool (a CPU node) starts with no profile and learns per
  signature from the actions it has finished, as a node worker does
  (:class:`~tangram_celery.scheduling.DurationModel` with the kind fallback and prior of
  :mod:`tangram_celery.scheduling.learned`);
* ``oracle``: the exact durations (an ablation: no real scheduler has them);
* ``noisy:SIGMA``: the exact durations times a log-normal error of log-sigma SIGMA, drawn once
  per action (an ablation: a profile that is right on average).

Only what the policy *sees* changes; every run lasts its true duration.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from tangram_celery.scheduling import DurationModel, Option
from tangram_celery.scheduling.learned import Prior, learn, learned_options
from tangram_celery.workloads.model import ActionSpec

DEFAULT_DURATIONS = "learned"
MODES = ("learned", "oracle", "noisy:SIGMA")


@dataclass(frozen=True)
class DurationMode:
    """A parsed ``--durations`` value: ``learned``, ``oracle`` or ``noisy`` with its sigma."""

    kind: str = DEFAULT_DURATIONS
    sigma: float = 0.0

    @property
    def label(self) -> str:
        """The mode as it is written on the command line."""
        return f"noisy:{self.sigma:g}" if self.kind == "noisy" else self.kind


def parse_durations(text: str) -> DurationMode:
    """``learned``, ``oracle`` or ``noisy:SIGMA``; ValueError names what is wrong."""
    name, _, value = text.strip().partition(":")
    if name in ("learned", "oracle") and not value:
        return DurationMode(name)
    if name == "noisy":
        try:
            sigma = float(value)
        except ValueError:
            sigma = -1.0
        if sigma >= 0 and math.isfinite(sigma):
            return DurationMode("noisy", sigma)
    raise ValueError(f"--durations {text!r}: use learned, oracle or noisy:SIGMA (SIGMA a "
                     "non-negative log-sigma, e.g. noisy:0.7)")


@dataclass
class Durations:
    """The durations a backend's policies see, one duration model per pool for ``learned``."""

    mode: DurationMode = field(default_factory=DurationMode)
    seed: int = 0
    prior: Prior = field(default_factory=Prior)
    models: dict[int, DurationModel] = field(default_factory=dict)

    def options(self, pool: int, job_id: str, spec: ActionSpec,
                exact: tuple[Option, ...]) -> tuple[Option, ...]:
        """The options of ``exact`` (the shape's, with true durations) as the policy sees
        them."""
        if self.mode.kind == "oracle":
            return exact
        if self.mode.kind == "noisy":
            error = math.exp(random.Random(f"{self.seed}:{job_id}").gauss(0.0, self.mode.sigma))
            return tuple((m, None if d is None else d * error) for m, d in exact)
        model = self.models.setdefault(pool, DurationModel())
        return learned_options(model, (spec.kind, spec.signature), [m for m, _ in exact],
                               self.prior)

    def observe(self, pool: int, spec: ActionSpec, units: int, seconds: float) -> None:
        """A pool finished an action that ran ``seconds`` on ``units`` units."""
        if self.mode.kind == "learned":
            learn(self.models.setdefault(pool, DurationModel()), (spec.kind, spec.signature),
                  units, seconds)
