"""The result of an action: the outcome, where it ran, its timestamps and its ACT split."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Timings:
    """Wall-clock stamps of one action's path, set by client and worker, all on the broker's
    clock (each process corrects its own by its measured offset)."""

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
    clock_offset_s: float = 0.0
    """How far the worker's clock was ahead of the broker's; its stamps here are already on
    the broker's clock (see :mod:`tangram_celery.tasks.clock`)."""
    clock_error_s: float = 0.0
    """Bound on that offset's estimate (half a Redis round trip; -1: not measured)."""


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
    isolation: str = ""
    """How the node that ran it held its limits (what a best-effort node did not enforce)."""

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
            "isolation": self.isolation,
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
            isolation=str(data.get("isolation", "")),
        )
