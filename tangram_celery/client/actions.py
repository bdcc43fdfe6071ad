"""The common actions, built and validated: a code snippet, a shell command, an elastic test run.

Each returns an :class:`~tangram_celery.action.Action` checked by
:func:`~tangram_celery.action.parse_action`, so a bad argument raises
:class:`~tangram_celery.errors.ValidationError` here, before anything is sent.
"""

from __future__ import annotations

from typing import Any

from tangram_celery.action import Action, parse_action


def code_action(
    trajectory_id: str, code: str, *, cpu: int | tuple[int, int] = 1, **fields: Any
) -> Action:
    """A Python snippet run in the trajectory's sandbox (kind ``exec``)."""
    return _build("exec", trajectory_id, {"code": code, **fields.pop("payload", {})}, cpu, fields)


def command_action(
    trajectory_id: str, cmd: str, *, cpu: int | tuple[int, int] = 1, **fields: Any
) -> Action:
    """A shell command run in the trajectory's sandbox (kind ``exec``)."""
    return _build("exec", trajectory_id, {"cmd": cmd, **fields.pop("payload", {})}, cpu, fields)


def test_run_action(
    trajectory_id: str,
    cmd: str = "python3 -m pytest -q",
    *,
    cpu: int | tuple[int, int] = (1, 4),
    elasticity: Any = None,
    **fields: Any,
) -> Action:
    """An elastic test run (kind ``test_run``): on a node that resizes runs (the default) its
    ``pytest`` becomes a malleable run whose cores change while it runs, elsewhere it gets
    ``-n k`` for ``k`` cores; ``payload={"malleable": False}`` keeps ``-n k``."""
    if elasticity is not None:
        fields["elasticity"] = elasticity
    return _build("test_run", trajectory_id, {"cmd": cmd, **fields.pop("payload", {})}, cpu,
                  fields)


test_run_action.__test__ = False  # type: ignore[attr-defined]


def _build(
    kind: str, trajectory_id: str, payload: dict[str, Any], cpu: int | tuple[int, int],
    fields: dict[str, Any],
) -> Action:
    if "files" in fields:
        payload["files"] = fields.pop("files")
    cost = dict(fields.pop("cost", {}))
    cost.setdefault("cpu", list(cpu) if isinstance(cpu, tuple) else cpu)
    body = {"kind": kind, "trajectory_id": trajectory_id, "payload": payload, "cost": cost,
            **fields}
    return parse_action(body)
