"""What a GPU pool expects a call to take when the call does not say (pure).

A GPU pool learns service times per (model, DoP) from the calls it served, as CPU nodes learn
per (signature, cores), with the same code (:mod:`tangram_celery.scheduling.learned`): a call is
learned under the kind ``reward`` and its :func:`service_key` (the model, and the submitter's
signature when it gives one that is not the model's name), so each model's time per DoP has its
own fit, and a model nothing is known about takes the shape and level pooled over the models
seen so far, or else the prior. Calls that state their ``t1`` are planned with what they state.
"""

from __future__ import annotations

from collections.abc import Sequence

from tangram_celery.scheduling.estimator import DurationModel, Signature
from tangram_celery.scheduling.learned import Prior, learned_options
from tangram_celery.scheduling.types import Option

SERVICE_KIND = "reward"
"""The kind GPU calls are learned under."""


def service_key(model: str, signature: str = "") -> str:
    """The key a call of ``model`` is learned under: the model, or ``model/signature`` when the
    submitter names a signature other than the model."""
    return model if not signature or signature == model else f"{model}/{signature}"


def service_signature(model: str, signature: str = "") -> Signature:
    """The duration model's signature of a call of ``model`` (see :func:`service_key`)."""
    return SERVICE_KIND, service_key(model, signature)


def service_options(durations: DurationModel, model: str, signature: str,
                    allowed: Sequence[int], elastic: bool, prior: Prior | None = None,
                    ) -> tuple[Option, ...]:
    """Each GPU count a call without ``t1`` may run at with its learned seconds (None where
    nothing is known): every count of ``allowed`` if the call is ``elastic``, else its
    smallest."""
    counts = sorted(set(allowed)) if elastic else [min(allowed)]
    return learned_options(durations, service_signature(model, signature), counts, prior)
