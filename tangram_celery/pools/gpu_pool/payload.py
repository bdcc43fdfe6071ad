"""The reward action's payload: its fields, how a GPU pool reads them, how a client builds one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tangram_celery.action import Action, parse_action
from tangram_celery.errors import ValidationError

PAYLOAD_FIELDS = frozenset({"model", "inputs", "pool"})


def reward_inputs(action: Action) -> tuple[str, Mapping[str, Any]]:
    """The model name and inputs of a reward action's payload (unknown fields refused)."""
    extra = sorted(set(action.payload) - PAYLOAD_FIELDS)
    if extra:
        raise ValidationError(
            f"payload.{extra[0]}", f"unknown field; a reward payload has {sorted(PAYLOAD_FIELDS)}"
        )
    inputs = action.payload.get("inputs")
    if not isinstance(inputs, Mapping):
        raise ValidationError("payload.inputs", "an object of input tensor name -> value(s)")
    return str(action.payload["model"]), inputs


def reward_action(
    trajectory_id: str,
    model: str,
    inputs: Mapping[str, Any],
    *,
    gpu: int | tuple[int, int] | Mapping[str, Any] = 1,
    pool: str | None = None,
    **fields: Any,
) -> Action:
    """A reward action: score ``inputs`` with ``model`` on ``gpu`` GPUs (a count, a range
    ``(min, max)`` or ``{"set": [1, 2, 4, 8]}``) of GPU pool ``pool`` (default: ``default``)."""
    payload: dict[str, Any] = {"model": model, "inputs": dict(inputs)}
    if pool is not None:
        payload["pool"] = pool
    cost = dict(fields.pop("cost", {}))
    cost.setdefault("gpu", list(gpu) if isinstance(gpu, tuple) else gpu)
    body = {"kind": "reward", "trajectory_id": trajectory_id, "payload": payload, "cost": cost,
            **fields}
    return parse_action(body)
