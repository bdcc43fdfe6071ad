"""Validation of an action: :func:`parse_action`, the one gate every message passes.

Every kind of bad input raises :class:`~tangram_celery.errors.ValidationError` (or
:class:`~tangram_celery.errors.SerializationError` for what is not JSON) naming the field.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Mapping
from typing import Any

from tangram_celery.action.model import (
    ID_PATTERN,
    KIND_POOL,
    MAX_PAYLOAD_DEPTH,
    MAX_UNITS,
    UNIT_RESOURCES,
    Action,
    ActionLimits,
    Amount,
    Elasticity,
    num,
)
from tangram_celery.errors import SerializationError, ValidationError

MAX_STEPS = 8

_ACTION_FIELDS = frozenset(
    {
        "id", "trajectory_id", "kind", "payload", "cost", "elasticity", "t1", "timeout_s",
        "signature", "submitted_at", "trajectory_memory_mb", "ephemeral",
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
        ephemeral=_flag("ephemeral", data.get("ephemeral", False)),
    )
    if action.ephemeral and action.pool != "cpu":
        raise ValidationError("ephemeral", "only CPU actions have one-request trajectories")
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
            raise ValidationError(where, f"min {num(low)} > max {num(high)}")
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
    if "steps" in payload:
        steps = payload["steps"]
        if "cmd" in payload or "code" in payload:
            raise ValidationError("payload", "give 'steps' or one of 'cmd' and 'code', not both")
        if not isinstance(steps, list) or not 1 <= len(steps) <= MAX_STEPS:
            raise ValidationError("payload.steps", f"expected a list of 1-{MAX_STEPS} steps")
        for i, step in enumerate(steps):
            _check_step(f"payload.steps.{i}", step)
    else:
        _check_command("payload", payload)
    files = payload.get("files", {})
    if not isinstance(files, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in files.items()
    ):
        raise ValidationError("payload.files", "expected an object of relative path -> text")
    for path in [*files, *_fetched(payload)]:
        if not path or path.startswith("/") or ".." in path.split("/") or "\x00" in path:
            raise ValidationError(f"payload.files.{path}", "paths must be relative, without '..'")
    for flag in ("session", "malleable"):
        if not isinstance(payload.get(flag, False), bool):
            raise ValidationError(f"payload.{flag}", "must be true or false")
    for name in ("memory_mb", "output_cap_bytes"):
        value = payload.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 1):
            raise ValidationError(f"payload.{name}", "must be a positive whole number")
    if "env" in payload:
        env = payload["env"]
        if not isinstance(env, Mapping) or not all(
            isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", k)
            and isinstance(v, str) for k, v in env.items()
        ):
            raise ValidationError("payload.env", "expected an object of NAME -> text")


def _check_command(where: str, payload: Mapping[str, Any]) -> None:
    has_cmd, has_code = "cmd" in payload, "code" in payload
    if has_cmd == has_code:
        raise ValidationError(where, "give exactly one of 'cmd' (shell) or 'code' (python)")
    name = "cmd" if has_cmd else "code"
    text = payload[name]
    if not isinstance(text, str) or not text.strip():
        raise ValidationError(f"{where}.{name}", "must be non-empty text")
    if "\x00" in text:
        raise ValidationError(f"{where}.{name}", "contains a NUL byte")


def _check_step(where: str, step: Any) -> None:
    """One step of a ``steps`` payload: a command or code, its stdin and its timeout."""
    if not isinstance(step, Mapping):
        raise ValidationError(where, "a step is an object with 'cmd' or 'code'")
    extra = sorted(set(step) - {"cmd", "code", "stdin", "timeout_s"})
    if extra:
        raise ValidationError(f"{where}.{extra[0]}", "unknown field of a step; known: cmd, "
                              "code, stdin, timeout_s")
    _check_command(where, step)
    if step.get("stdin") is not None and not isinstance(step["stdin"], str):
        raise ValidationError(f"{where}.stdin", "must be text or null")
    if step.get("timeout_s") is not None:
        _optional_positive(f"{where}.timeout_s", step["timeout_s"])


def _fetched(payload: Mapping[str, Any]) -> list[str]:
    fetch = payload.get("fetch", [])
    if not isinstance(fetch, list) or not all(isinstance(p, str) for p in fetch):
        raise ValidationError("payload.fetch", "expected a list of relative file paths")
    return list(fetch)


def _flag(name: str, raw: Any) -> bool:
    if not isinstance(raw, bool):
        raise ValidationError(name, "must be true or false")
    return raw


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
        raise ValidationError(where, f"negative amount {num(value)}")
    if integral and value != int(value):
        raise ValidationError(where, f"{num(value)} is not a whole number of units")
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
