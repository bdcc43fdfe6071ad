"""Options from what a `DurationModel` has learned, with a prior for what it has not (pure).

A node that starts with no profile must still give a new elastic action more than one unit,
or it never sees the action at two unit counts and never learns its elasticity. So
`learned_options` takes the shape of the duration curve from, in order:

1. the action's own signature, once its Amdahl fit exists (two distinct unit counts seen);
2. else its kind (`kind_signature`: every action of that kind the model has seen, whatever
   its signature), once that fit exists;
3. else Amdahl's law with the prior's parallel fraction (`Prior.parallel`),

and its level from the signature's own observation where there is one (its expected seconds
at the count it was seen at), else from the kind's, else from `Prior.t1`. `learn` feeds both
the signature and its kind, so the kind's curve covers every count any of its actions ran at.
An inelastic action (one allowed count) nothing is known about keeps an unknown duration.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tangram_celery.scheduling.estimator import DurationModel, Signature
from tangram_celery.scheduling.types import Option

ANY = "*"
"""The key of a kind's pooled signature."""


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


def learn(model: DurationModel, signature: Signature, units: int, seconds: float) -> None:
    """Observe a finished action under its signature and under its kind."""
    model.observe(signature, units, seconds)
    if signature[1] != ANY:
        model.observe(kind_signature(signature), units, seconds)


def learned_options(model: DurationModel, signature: Signature, allowed: Sequence[int],
                    prior: Prior | None = None) -> tuple[Option, ...]:
    """Each allowed count with its expected seconds (see the module docstring)."""
    counts = sorted(set(allowed))
    kind = kind_signature(signature)
    own = model.observed(signature)
    if len(counts) == 1 and not own and not model.known(kind):
        return ((counts[0], None),)
    curve = _curve(model, signature, len(own) >= 2) or _curve(model, kind, True)
    if curve is None:
        chosen = prior or Prior()
        curve = chosen.duration
    level = _level(model, signature if own else kind)
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
