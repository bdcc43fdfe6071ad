"""The action as data: its kinds and resources, the cost vector, the elasticity, the action.

Plain frozen dataclasses with their JSON forms; :mod:`tangram_celery.action.parsing` builds them
from messages and :mod:`tangram_celery.action.result` holds what comes back.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ID_PATTERN = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
API_PATTERN = re.compile(r"^[a-z0-9_-]{1,64}$")
KIND_POOL = {"exec": "cpu", "test_run": "cpu", "reward": "gpu", "api": "api"}
UNIT_RESOURCES = ("cpu", "gpu")
QUANTITY_RESOURCES = ("memory_mb", "gpu_memory_mb")
BASE_RESOURCES = UNIT_RESOURCES + QUANTITY_RESOURCES
MAX_UNITS = 4096
MAX_PAYLOAD_DEPTH = 64


@dataclass(frozen=True)
class ActionLimits:
    """The bounds validation enforces; built from :class:`~tangram_celery.settings.Settings`."""

    max_payload_bytes: int = 262144
    max_timeout_s: float = 900.0
    apis: frozenset[str] = frozenset()
    extra_resources: frozenset[str] = frozenset()

    def known_resources(self) -> frozenset[str]:
        """Resource names an action may ask for."""
        return (
            frozenset(BASE_RESOURCES)
            | frozenset(f"api:{a}" for a in self.apis)
            | self.extra_resources
        )


@dataclass(frozen=True)
class Amount:
    """One cost-vector entry: a fixed amount, a range, or a discrete set of allowed amounts."""

    min: float
    max: float
    choices: tuple[float, ...] | None = None

    @property
    def elastic(self) -> bool:
        """True when more than one amount is allowed."""
        return self.max > self.min

    def allowed_units(self) -> tuple[int, ...]:
        """Every allowed whole-unit amount, ascending (for cpu and gpu)."""
        if self.choices is not None:
            return tuple(int(c) for c in self.choices)
        return tuple(range(int(self.min), int(self.max) + 1))

    def to_json(self) -> Any:
        """The compact JSON form :func:`~tangram_celery.action.parsing.parse_amount` reads back."""
        if self.choices is not None:
            return {"set": [num(c) for c in self.choices]}
        if self.elastic:
            return [num(self.min), num(self.max)]
        return num(self.min)


@dataclass(frozen=True)
class Elasticity:
    """``E(m)``: the efficiency of ``m`` units of the key resource (``0 < E(m) <= 1``).

    ``model`` is ``"linear"`` (E = 1), ``"amdahl"`` (parallel fraction ``p``) or ``"table"``
    (explicit values; missing ``m`` are interpolated from the nearest lower entry).
    """

    model: str
    parallel_fraction: float = 1.0
    table: tuple[tuple[int, float], ...] = ()

    def efficiency(self, m: int) -> float:
        """E(m) for ``m >= 1`` units."""
        if m <= 1 or self.model == "linear":
            return 1.0
        if self.model == "amdahl":
            speedup = 1.0 / ((1.0 - self.parallel_fraction) + self.parallel_fraction / m)
            return speedup / m
        best = 1.0
        for units, value in self.table:
            if units <= m:
                best = value * units / m if units < m else value
        return best

    def duration(self, t1: float, m: int) -> float:
        """Expected duration with ``m`` units: ``T1 / (E(m) * m)``."""
        return t1 / (self.efficiency(m) * max(m, 1))

    def to_json(self) -> Any:
        """The JSON form :func:`~tangram_celery.action.parsing.parse_elasticity` reads back."""
        if self.model == "linear":
            return "linear"
        if self.model == "amdahl":
            return {"amdahl": self.parallel_fraction}
        return {"table": {str(m): e for m, e in self.table}}


@dataclass(frozen=True)
class Action:
    """One validated action. Build it with :func:`~tangram_celery.action.parsing.parse_action`
    or the helpers in ``client``."""

    id: str
    trajectory_id: str
    kind: str
    payload: Mapping[str, Any]
    cost: Mapping[str, Amount]
    elasticity: Elasticity | None = None
    t1: float | None = None
    timeout_s: float | None = None
    signature: str = ""
    submitted_at: float | None = None
    trajectory_memory_mb: float | None = None
    ephemeral: bool = False
    """The action is its trajectory's only one: it runs in a recycled sandbox, and its
    trajectory (its memory reservation) ends with it, on the node."""

    @property
    def pool(self) -> str:
        """The pool type that runs it: ``cpu``, ``gpu`` or ``api``."""
        return KIND_POOL[self.kind]

    @property
    def key_resource(self) -> str:
        """The unit resource whose count the scheduler chooses (cpu or gpu)."""
        return "gpu" if self.pool == "gpu" else "cpu"

    def units(self) -> Amount:
        """The cost-vector entry of the key resource (1 unit when not given)."""
        return self.cost.get(self.key_resource, Amount(1, 1))

    def apis(self) -> tuple[str, ...]:
        """The basic (quota-limited) resources the action needs."""
        return tuple(sorted(r[4:] for r in self.cost if r.startswith("api:")))

    def expected_duration(self, m: int) -> float | None:
        """T(m) from T1 and the elasticity; None when T1 is unknown."""
        if self.t1 is None:
            return None
        if self.elasticity is None:
            return self.t1
        return self.elasticity.duration(self.t1, m)

    def to_json(self) -> dict[str, Any]:
        """The JSON message body; :func:`~tangram_celery.action.parsing.parse_action` of it gives
        an equal action."""
        body: dict[str, Any] = {
            "id": self.id,
            "trajectory_id": self.trajectory_id,
            "kind": self.kind,
            "payload": dict(self.payload),
            "cost": {name: amount.to_json() for name, amount in self.cost.items()},
        }
        optional = {
            "elasticity": None if self.elasticity is None else self.elasticity.to_json(),
            "t1": self.t1,
            "timeout_s": self.timeout_s,
            "signature": self.signature or None,
            "submitted_at": self.submitted_at,
            "trajectory_memory_mb": self.trajectory_memory_mb,
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        if self.ephemeral:
            body["ephemeral"] = True
        return body

    def summary(self) -> str:
        """A short one-line description, bounded in size whatever the payload."""
        units = self.units()
        span = f"{num(units.min)}" if not units.elastic else f"{num(units.min)}-{num(units.max)}"
        return f"traj={self.trajectory_id[:40]} kind={self.kind} {self.key_resource}={span}"


def num(value: float) -> int | float:
    """``value`` as an int when it is whole: how amounts are written in JSON and messages."""
    return int(value) if float(value).is_integer() else value
