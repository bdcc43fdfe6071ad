"""The action model: what a training script submits, its validation, and the result with its ACT.

An *action* is one atomic use of external resources between two LLM generations of a trajectory.
Its **cost vector** has one entry per resource type: a fixed amount, a range ``[min, max]`` or a
discrete set of allowed amounts. An optional **elasticity** ``E(m)`` says how the duration with
``m`` units of the key resource shrinks: ``T(m) = T1 / (E(m) * m)``. Everything here is plain
data that round-trips through JSON; :func:`parse_action` is the one gate every message passes.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tangram_celery.errors import SerializationError, ValidationError

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
        """The compact JSON form :func:`parse_amount` reads back."""
        if self.choices is not None:
            return {"set": [_num(c) for c in self.choices]}
        if self.elastic:
            return [_num(self.min), _num(self.max)]
        return _num(self.min)


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
        """The JSON form :func:`parse_elasticity` reads back."""
        if self.model == "linear":
            return "linear"
        if self.model == "amdahl":
            return {"amdahl": self.parallel_fraction}
        return {"table": {str(m): e for m, e in self.table}}


@dataclass(frozen=True)
class Action:
    """One validated action. Build it with :func:`parse_action` or the helpers in ``client``."""

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
        """The JSON message body; :func:`parse_action` of it gives an equal action."""
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
        return body

    def summary(self) -> str:
        """A short one-line description, bounded in size whatever the payload."""
        units = self.units()
        span = f"{_num(units.min)}" if not units.elastic else f"{_num(units.min)}-{_num(units.max)}"
        return f"traj={self.trajectory_id[:40]} kind={self.kind} {self.key_resource}={span}"


_ACTION_FIELDS = frozenset(
    {
        "id", "trajectory_id", "kind", "payload", "cost", "elasticity", "t1", "timeout_s",
        "signature", "submitted_at", "trajectory_memory_mb",
    }
)


def parse_action(data: Any, limits: ActionLimits | None = None) -> Action:
    """Validate a JSON-shaped mapping (or a JSON string) and return an :class:`Action`.

    Raises :class:`ValidationError` naming the field and the reason for every kind of bad input:
    missing or malformed ids, unknown kinds and resources, empty or inverted ranges, negative
    amounts, non-JSON or oversized payloads, impossible elasticities or timeouts.
    """
    limits = limits or ActionLimits()
    if isinstance(data, str | bytes):
        data = _loads(data)
    if not isinstance(data, Mapping):
        raise ValidationError("action", f"expected a JSON object, got {type(data).__name__}")
    extra = sorted(set(data) - _ACTION_FIELDS)
    if extra:
        raise ValidationError(extra[0], f"unknown field; known fields: {sorted(_ACTION_FIELDS)}")
    kind = _kind(data.get("kind"))
    cost = parse_cost(data.get("cost", {}), limits)
    _check_pool_cost(kind, cost)
    action = Action(
        id=_identifier("id", data.get("id", uuid.uuid4().hex)),
        trajectory_id=_identifier("trajectory_id", data.get("trajectory_id")),
        kind=kind,
        payload=parse_payload(kind, data.get("payload"), limits),
        cost=cost,
        elasticity=parse_elasticity(data.get("elasticity")),
        t1=_optional_positive("t1", data.get("t1")),
        timeout_s=_timeout(data.get("timeout_s"), limits),
        signature=_signature(data.get("signature")),
        submitted_at=_optional_positive("submitted_at", data.get("submitted_at")),
        trajectory_memory_mb=_optional_positive(
            "trajectory_memory_mb", data.get("trajectory_memory_mb")
        ),
    )
    return action


def parse_amount(name: str, raw: Any, *, integral: bool) -> Amount:
    """Parse one cost-vector entry.

    Forms: ``4``, ``[1, 8]``, ``{"min": 1, "max": 8}`` or ``{"set": [1, 2, 4]}``.
    """
    where = f"cost.{name}"
    if isinstance(raw, Mapping) and set(raw) == {"set"}:
        raw_choices = raw["set"]
        if not isinstance(raw_choices, list | tuple) or not raw_choices:
            raise ValidationError(where, "a discrete set must be a non-empty list of amounts")
        values = sorted({_amount_value(where, v, integral) for v in raw_choices})
        return Amount(values[0], values[-1], tuple(values))
    if isinstance(raw, Mapping) and set(raw) == {"min", "max"}:
        raw = [raw["min"], raw["max"]]
    if isinstance(raw, list | tuple):
        if len(raw) != 2:
            raise ValidationError(where, f"a range is [min, max]; got {len(raw)} values")
        low = _amount_value(where + ".min", raw[0], integral)
        high = _amount_value(where + ".max", raw[1], integral)
        if low > high:
            raise ValidationError(where, f"min {_num(low)} > max {_num(high)}")
        return Amount(low, high)
    if isinstance(raw, Mapping):
        raise ValidationError(where, "expected a number, [min, max], {min, max} or {set: [...]}")
    value = _amount_value(where, raw, integral)
    return Amount(value, value)


def parse_cost(raw: Any, limits: ActionLimits) -> dict[str, Amount]:
    """Parse a whole cost vector; unknown resources are refused with the list of known ones."""
    if not isinstance(raw, Mapping):
        raise ValidationError("cost", "expected an object mapping resource name to amount")
    known = limits.known_resources()
    cost: dict[str, Amount] = {}
    for name, value in raw.items():
        if name not in known:
            raise ValidationError(
                f"cost.{name}",
                f"unknown resource; known: {sorted(known)} (declare APIs in TANGRAM_API_LIMITS)",
            )
        integral = name in UNIT_RESOURCES or name.startswith("api:")
        amount = parse_amount(name, value, integral=integral)
        if name in UNIT_RESOURCES and amount.min < 1 and name == "cpu":
            raise ValidationError(f"cost.{name}", "a CPU action needs at least 1 core")
        cost[name] = amount
    return cost


def parse_elasticity(raw: Any) -> Elasticity | None:
    """Parse ``None``/``"unknown"``, ``"linear"``, ``{"amdahl": p}`` or ``{"table": {m: E}}``."""
    if raw is None or raw == "unknown":
        return None
    if raw == "linear":
        return Elasticity("linear")
    if isinstance(raw, Mapping) and set(raw) == {"amdahl"}:
        p = raw["amdahl"]
        if not _is_number(p) or not 0.0 <= float(p) <= 1.0:
            raise ValidationError("elasticity.amdahl", "the parallel fraction must be in [0, 1]")
        return Elasticity("amdahl", parallel_fraction=float(p))
    if isinstance(raw, Mapping) and set(raw) == {"table"} and isinstance(raw["table"], Mapping):
        entries: list[tuple[int, float]] = []
        for key, value in raw["table"].items():
            units = _int_key(f"elasticity.table.{key}", key)
            if not _is_number(value) or not 0.0 < float(value) <= 1.0:
                raise ValidationError(f"elasticity.table.{key}", "E(m) must be in (0, 1]")
            entries.append((units, float(value)))
        if not entries:
            raise ValidationError("elasticity.table", "an elasticity table needs entries")
        return Elasticity("table", table=tuple(sorted(entries)))
    raise ValidationError(
        "elasticity", 'expected "unknown", "linear", {"amdahl": p} or {"table": {"m": E(m)}}'
    )


def parse_payload(kind: str, raw: Any, limits: ActionLimits) -> dict[str, Any]:
    """Check a payload is a JSON object within the size limit, with the fields its kind needs."""
    if not isinstance(raw, Mapping):
        raise ValidationError("payload", f"expected a JSON object, got {type(raw).__name__}")
    if _depth_exceeds(raw, MAX_PAYLOAD_DEPTH):
        raise ValidationError("payload", f"nested deeper than {MAX_PAYLOAD_DEPTH} levels")
    try:
        encoded = json.dumps(raw, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise SerializationError("payload", f"not JSON-serializable: {exc}") from None
    if len(encoded.encode()) > limits.max_payload_bytes:
        raise ValidationError(
            "payload",
            f"{len(encoded.encode())} bytes exceeds the {limits.max_payload_bytes}-byte limit "
            "(TANGRAM_MAX_PAYLOAD_BYTES); ship large inputs as files in the trajectory's env",
        )
    payload: dict[str, Any] = json.loads(encoded)
    if KIND_POOL[kind] == "cpu":
        _check_command_payload(payload)
    elif kind == "reward" and not isinstance(payload.get("model"), str):
        raise ValidationError("payload.model", "a reward action names its model (a string)")
    return payload


def _depth_exceeds(value: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, Mapping):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list | tuple):
            stack.extend((v, depth + 1) for v in item)
    return False


def _check_command_payload(payload: Mapping[str, Any]) -> None:
    has_cmd, has_code = "cmd" in payload, "code" in payload
    if has_cmd == has_code:
        raise ValidationError("payload", "give exactly one of 'cmd' (shell) or 'code' (python)")
    text = payload["cmd" if has_cmd else "code"]
    if not isinstance(text, str) or not text.strip():
        raise ValidationError(f"payload.{'cmd' if has_cmd else 'code'}", "must be non-empty text")
    if "\x00" in text:
        raise ValidationError(f"payload.{'cmd' if has_cmd else 'code'}", "contains a NUL byte")
    files = payload.get("files", {})
    if not isinstance(files, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in files.items()
    ):
        raise ValidationError("payload.files", "expected an object of relative path -> text")
    for path in files:
        if not path or path.startswith("/") or ".." in path.split("/") or "\x00" in path:
            raise ValidationError(f"payload.files.{path}", "paths must be relative, without '..'")
    if "env" in payload:
        env = payload["env"]
        if not isinstance(env, Mapping) or not all(
            isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", k)
            and isinstance(v, str) for k, v in env.items()
        ):
            raise ValidationError("payload.env", "expected an object of NAME -> text")


def _check_pool_cost(kind: str, cost: Mapping[str, Amount]) -> None:
    pool = KIND_POOL[kind]
    if pool == "cpu" and "gpu" in cost:
        raise ValidationError("cost.gpu", f"a {kind} action runs on CPU nodes; use kind 'reward'")
    if pool == "gpu" and "cpu" in cost and cost["cpu"].elastic:
        raise ValidationError("cost.cpu", "a reward action's elastic resource is gpu, not cpu")
    if pool == "api" and not any(name.startswith("api:") for name in cost):
        raise ValidationError("cost", "an api action names at least one 'api:<name>' resource")
    units = cost.get("gpu" if pool == "gpu" else "cpu")
    if units is not None and units.max > MAX_UNITS:
        raise ValidationError("cost", f"at most {MAX_UNITS} units per action")


def _kind(raw: Any) -> str:
    if raw is None:
        raise ValidationError("kind", f"missing; one of {sorted(KIND_POOL)}")
    if raw not in KIND_POOL:
        raise ValidationError("kind", f"unknown kind {str(raw)[:40]!r}; one of {sorted(KIND_POOL)}")
    return str(raw)


def _identifier(name: str, raw: Any) -> str:
    if raw is None or raw == "":
        raise ValidationError(name, "missing; every action needs one")
    if not isinstance(raw, str) or not ID_PATTERN.fullmatch(raw):
        raise ValidationError(name, "must be 1-128 characters of A-Z a-z 0-9 . _ : -")
    return raw


def _signature(raw: Any) -> str:
    if raw is None:
        return ""
    if not isinstance(raw, str) or len(raw) > 200:
        raise ValidationError("signature", "must be text of at most 200 characters")
    return raw


def _timeout(raw: Any, limits: ActionLimits) -> float | None:
    value = _optional_positive("timeout_s", raw)
    if value is not None and value > limits.max_timeout_s:
        raise ValidationError(
            "timeout_s",
            f"{value} s exceeds the {limits.max_timeout_s} s maximum (TANGRAM_MAX_TIMEOUT_S), "
            "which keeps it below the broker's visibility timeout",
        )
    return value


def _optional_positive(name: str, raw: Any) -> float | None:
    if raw is None:
        return None
    if not _is_number(raw) or not float(raw) > 0:
        raise ValidationError(name, "must be a positive finite number")
    return float(raw)


def _amount_value(where: str, raw: Any, integral: bool) -> float:
    if not _is_number(raw):
        raise ValidationError(where, f"expected a number, got {type(raw).__name__}")
    value = float(raw)
    if value < 0:
        raise ValidationError(where, f"negative amount {_num(value)}")
    if integral and value != int(value):
        raise ValidationError(where, f"{_num(value)} is not a whole number of units")
    return value


def _int_key(where: str, raw: Any) -> int:
    try:
        units = int(raw)
    except (TypeError, ValueError):
        raise ValidationError(where, "unit counts must be whole numbers") from None
    if units < 1:
        raise ValidationError(where, "unit counts start at 1")
    return units


def _is_number(raw: Any) -> bool:
    return (
        isinstance(raw, int | float) and not isinstance(raw, bool) and math.isfinite(float(raw))
    )


def _loads(raw: str | bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise SerializationError("action", f"not valid JSON: {exc}") from None


def _num(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


@dataclass
class Timings:
    """Wall-clock stamps (``time.time()``) of one action's path, set by client and worker."""

    submitted: float = 0.0
    published: float = 0.0
    received: float = 0.0
    admitted: float = 0.0
    exec_started: float = 0.0
    exec_finished: float = 0.0
    stored: float = 0.0
    completed: float = 0.0
    exec_s: float = 0.0
    setup_s: float = 0.0
    sched_s: float = 0.0
    """Wall seconds of the scheduling decision that admitted the action (part of its queue)."""


@dataclass
class ActionResult:
    """What a training script gets back: the outcome, where it ran, and its ACT split.

    ``act`` has ``queue`` (from the hand-off to the broker, stamped just before the publish,
    to admission with units), ``exec`` (the command
    itself), ``overhead`` (everything else: validation, routing, publish, sandbox setup, result
    store and fetch) and ``total``; the three parts add up to ``total`` by construction and each
    is measured from the stamps in ``timings``.
    """

    action_id: str
    trajectory_id: str
    kind: str
    status: str
    output: dict[str, Any] = field(default_factory=dict)
    node: str = ""
    units: tuple[int, ...] = ()
    timings: Timings = field(default_factory=Timings)
    error: str = ""
    attempts: int = 1

    @property
    def ok(self) -> bool:
        """True when the action ran and its command exited 0."""
        return self.status == "ok"

    @property
    def act(self) -> dict[str, float]:
        """ACT parts in seconds: queue, exec, overhead and total."""
        t = self.timings
        end = t.completed or t.stored
        total = max(end - t.submitted, 0.0)
        queue = max(t.admitted - t.published, 0.0) if t.admitted else 0.0
        execution = t.exec_s
        overhead = max(total - queue - execution, 0.0)
        return {"queue": queue, "exec": execution, "overhead": overhead, "total": total}

    def to_json(self) -> dict[str, Any]:
        """JSON form stored in the result backend."""
        return {
            "action_id": self.action_id,
            "trajectory_id": self.trajectory_id,
            "kind": self.kind,
            "status": self.status,
            "output": self.output,
            "node": self.node,
            "units": list(self.units),
            "timings": vars(self.timings).copy(),
            "error": self.error,
            "attempts": self.attempts,
            "act": self.act,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ActionResult:
        """Rebuild a result from its JSON form."""
        return cls(
            action_id=str(data["action_id"]),
            trajectory_id=str(data["trajectory_id"]),
            kind=str(data["kind"]),
            status=str(data["status"]),
            output=dict(data.get("output", {})),
            node=str(data.get("node", "")),
            units=tuple(int(u) for u in data.get("units", ())),
            timings=Timings(**{k: float(v) for k, v in data.get("timings", {}).items()}),
            error=str(data.get("error", "")),
            attempts=int(data.get("attempts", 1)),
        )
