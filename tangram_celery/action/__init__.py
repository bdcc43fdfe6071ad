"""The action model: what a training script submits, its validation, and the result with its ACT.

An *action* is one atomic use of external resources between two LLM generations of a trajectory.
Its **cost vector** has one entry per resource type: a fixed amount, a range ``[min, max]`` or a
discrete set of allowed amounts. An optional **elasticity** ``E(m)`` says how the duration with
``m`` units of the key resource shrinks: ``T(m) = T1 / (E(m) * m)``. Everything here is plain
data that round-trips through JSON; :func:`parse_action` is the one gate every message passes.

* :mod:`tangram_celery.action.model`: the kinds and resources, :class:`ActionLimits`,
  :class:`Amount`, :class:`Elasticity` and :class:`Action`.
* :mod:`tangram_celery.action.parsing`: :func:`parse_action` and the parsers of its parts.
* :mod:`tangram_celery.action.result`: :class:`Timings` and :class:`ActionResult`.

May import: the ground floor; of it, only ``errors``, since every other part reads actions.
"""

from __future__ import annotations

from tangram_celery.action.model import Action, ActionLimits, Elasticity
from tangram_celery.action.parsing import parse_action, parse_amount
from tangram_celery.action.result import ActionResult, Timings

__all__ = [
    "Action",
    "ActionLimits",
    "ActionResult",
    "Elasticity",
    "Timings",
    "parse_action",
    "parse_amount",
]
