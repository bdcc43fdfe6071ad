"""Options from what a `DurationModel` has learned, with a prior for what it has not (pure).

A node that starts with no profile must still give a new elastic action more than one unit,
or it never sees the action at two unit counts and never learns its elasticity. So
`learned_options` takes the shape of the duration curve from, in order:

1. the action's own signature, once its Amdahl fit exists (two distinct unit counts seen);
2. else its kind's pooled shape (`shape_signature`), once that has a fit: the durations of
   the kind's signatures that have fits of their own, each over its own single-unit time;
3. else Amdahl's law with the prior's parallel fraction (`Prior.parallel`),

and its level from the signature's own observation where there is one (its expected seconds
at the count it was seen at), else from the kind's pooled level (`level_signature`: the
single-unit seconds each finished action of the kind implies through the kind's shape), else
from `Prior.t1`. An inelastic action (one allowed count) nothing is known about keeps an
unknown duration.

Why the kind's shape and level are pooled that way, and not as one curve over every raw
duration of the kind: signatures differ in length far more than counts differ in speed, and
which count an action ran at depends on the load it met, so one Amdahl fit over all of them
mixes the two (long suites that happened to run wide look like a flat curve). Dividing each
duration by its own signature's single-unit time keeps only the shape; dividing it by the
shape at its count keeps only the level.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tangram_celery.scheduling.estimator import DurationModel, Signature
from tangram_celery.scheduling.types import Option

ANY = "*"
"""The key of a kind's pooled signature."""

LEVEL = "*t1"
"""The key of a kind's pooled single-unit level."""

SHAPE = "*shape"
"""The key of a kind's pooled shape: its signatures' durations over their own single-unit
times, from signatures with a fit of their own."""

_POOLED = (ANY, LEVEL, SHAPE)


@dataclass(frozen=True)
class Prior:
    """What is assumed of an elastic action nothing is known about: its single-unit seconds
    and Amdahl's parallel fraction (0.5: at most twice as fast on many units)."""

    t1: float = 10.0
    parallel: float = 0.5

    def __post_init__(self) -> None:
        if not self.t1 > 0 or not 0.0 <= self.parallel <= 1.0:
            raise ValueError("a prior needs t1 > 0 and a parallel fraction in [0, 1]")

    def duration(self, units: int) -> float:
        """Seconds at ``units`` under the prior."""
        return self.t1 * ((1.0 - self.parallel) + self.parallel / units)


def kind_signature(signature: Signature) -> Signature:
    """The pooled signature of ``signature``'s kind."""
    return (signature[0], ANY)


def shape_signature(signature: Signature) -> Signature:
    """The pooled shape of ``signature``'s kind."""
    return (signature[0], SHAPE)


def level_signature(signature: Signature) -> Signature:
    """The pooled single-unit level of ``signature``'s kind."""
    return (signature[0], LEVEL)


def learn(model: DurationModel, signature: Signature, units: int, seconds: float,
          prior: Prior | None = None) -> None:
    """Observe a finished action under its signature and its kind; once the signature has a
    fit of its own, under its kind's shape (over its own single-unit time: at every count it
    has seen, the first time); then under its kind's level, as the single-unit seconds it
    implies through the kind's shape."""
    seen = model.observed(signature)
    model.observe(signature, units, seconds)
    if signature[1] in _POOLED:
        return
    model.observe(kind_signature(signature), units, seconds)
    counts = model.observed(signature)
    t1 = model.t1(signature) if len(counts) >= 2 else None
    if t1:
        fresh = len(seen) < 2 and units not in seen
        for count in counts if fresh else (units,):
            estimate = model.estimate(signature, count) if count != units else seconds
            if estimate:
                model.observe(shape_signature(signature), count, estimate / t1)
    shape = _shape(model, signature, prior or Prior())
    model.observe(level_signature(signature), 1, seconds / shape(units))


def _shape(model: DurationModel, signature: Signature, prior: Prior
           ) -> Callable[[int], float]:
    """The kind's shape of ``signature`` (its pooled shape if fitted, else the prior's),
    scaled to 1 at one unit."""
    curve = _curve(model, shape_signature(signature), True) or prior.duration
    one = curve(1)
    return lambda units: curve(units) / one


def learned_options(model: DurationModel, signature: Signature, allowed: Sequence[int],
                    prior: Prior | None = None) -> tuple[Option, ...]:
    """Each allowed count with its expected seconds (see the module docstring)."""
    counts = sorted(set(allowed))
    kind = kind_signature(signature)
    own = model.observed(signature)
    if len(counts) == 1 and not own and not model.known(kind):
        return ((counts[0], None),)
    curve = _curve(model, signature, len(own) >= 2) or _curve(
        model, shape_signature(signature), True)
    if curve is None:
        chosen = prior or Prior()
        curve = chosen.duration
    level = _level(model, signature if own else level_signature(signature))
    if level is None:
        return tuple((m, curve(m)) for m in counts)
    units, seconds = level
    scale = seconds / curve(units)
    return tuple((m, curve(m) * scale) for m in counts)


def _curve(model: DurationModel, signature: Signature, fitted: bool
           ) -> Callable[[int], float] | None:
    """The model's duration curve of ``signature`` if it has a fit (two counts seen)."""
    if not fitted or len(model.observed(signature)) < 2:
        return None

    def at(units: int) -> float:
        seconds = model.estimate(signature, units)
        assert seconds is not None
        return seconds

    return at


def _level(model: DurationModel, signature: Signature) -> tuple[int, float] | None:
    """The smallest count ``signature`` was seen at and its expected seconds there."""
    seen = model.observed(signature)
    if not seen:
        return None
    seconds = model.estimate(signature, seen[0])
    return None if seconds is None else (seen[0], seconds)

