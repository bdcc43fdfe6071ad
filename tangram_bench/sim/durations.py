"""What the pooled systems' policies are told an action will take: learned, exact or noisy.

The CPU nodes and the GPU pool alike (the same modes, the same learning code). A GPU call is
learned under its model (service) and the parallelism (DoP) it ran at: its signature is the
service's name, so the model fits each service's time per DoP from what the pool served.

* ``learned`` (the default): the cluster starts with no profile and learns per signature from
  the actions every pool has finished, as node workers do when they share what they learn
  (:class:`~tangram_celery.pools.cpu_pool.SharedDurations`, ``TANGRAM_DURATIONS_SYNC_S``;
  :class:`~tangram_celery.scheduling.DurationModel` with the kind's shape, level and prior of
  :mod:`tangram_celery.scheduling.learned`). The sim shares at once; workers within the sync
  interval;
* ``learned:node``: each pool (a CPU node, the GPU pool) learns alone from its own finished
  actions (an ablation: workers with ``TANGRAM_DURATIONS_SYNC_S=0``);
* ``oracle``: the exact durations (an ablation: no real scheduler has them);
* ``noisy:SIGMA``: the exact durations times a log-normal error of log-sigma SIGMA, drawn once
  per action (an ablation: a profile that is right on average).

Only what the policy *sees* changes; every run lasts its true duration.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from tangram_bench.workloads.model import ActionSpec
from tangram_celery.scheduling import DurationModel, Option
from tangram_celery.scheduling.estimator import Signature
from tangram_celery.scheduling.learned import Prior, learn, learned_options

DEFAULT_DURATIONS = "learned"
MODES = ("learned", "learned:node", "oracle", "noisy:SIGMA")
ABLATION = " (an ablation: the default, learned, is what a real pool can do)"


def ablation(label: str) -> str:
    """What a report writes after a durations mode: nothing for the default, else that it is
    an ablation."""
    return "" if label == DEFAULT_DURATIONS else ABLATION


@dataclass(frozen=True)
class DurationMode:
    """A parsed ``--durations`` value: ``learned`` (cluster-wide; ``per_node``: each node
    alone), ``oracle`` or ``noisy`` with its sigma."""

    kind: str = DEFAULT_DURATIONS
    sigma: float = 0.0
    per_node: bool = False

    @property
    def label(self) -> str:
        """The mode as it is written on the command line."""
        if self.kind == "noisy":
            return f"noisy:{self.sigma:g}"
        return "learned:node" if self.per_node else self.kind


def parse_durations(text: str) -> DurationMode:
    """``learned``, ``learned:node``, ``oracle`` or ``noisy:SIGMA``; ValueError names what is
    wrong."""
    name, _, value = text.strip().partition(":")
    if name in ("learned", "oracle") and not value:
        return DurationMode(name)
    if name == "learned" and value == "node":
        return DurationMode(name, per_node=True)
    if name == "noisy":
        try:
            sigma = float(value)
        except ValueError:
            sigma = -1.0
        if sigma >= 0 and math.isfinite(sigma):
            return DurationMode("noisy", sigma)
    raise ValueError(f"--durations {text!r}: use learned, learned:node, oracle or noisy:SIGMA "
                     "(SIGMA a non-negative log-sigma, e.g. noisy:0.7)")


def signature(spec: ActionSpec) -> Signature:
    """What a duration model learns ``spec`` under: its kind, and its service (the GPU model
    or API) and submitter's signature where it has them."""
    return spec.kind, "/".join(part for part in (spec.service, spec.signature) if part)


@dataclass
class Durations:
    """The durations a backend's policies see: for ``learned``, one duration model for the
    cluster (one per pool with ``per_node``)."""

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
        return learned_options(self._model(pool), signature(spec), [m for m, _ in exact],
                               self.prior)

    def observe(self, pool: int, spec: ActionSpec, units: int, seconds: float) -> None:
        """A pool finished an action that ran ``seconds`` on ``units`` units."""
        if self.mode.kind == "learned":
            learn(self._model(pool), signature(spec), units, seconds, self.prior)

    def _model(self, pool: int) -> DurationModel:
        return self.models.setdefault(pool if self.mode.per_node else 0, DurationModel())

