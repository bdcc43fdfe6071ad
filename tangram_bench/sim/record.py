"""What a simulation run produces: one record per action, unit allocations, the run's totals.

Every record splits its ACT (``finished - submitted``) into ``queue`` (waiting for units, a
pod slot or a quota), ``exec`` (running) and ``overhead`` (everything the system adds:
dispatch, sandbox or container exec latency, pod start, model restore); the three add up to
the total by construction.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Live:
    """An action in flight: which trajectory, which of its actions, when it was submitted."""

    trajectory: int
    index: int
    submitted: float


@dataclass(frozen=True)
class ActionRecord:
    """One finished action and its ACT parts (seconds).

    ``units``: the unit count it ran with (cores, GPUs; for a pod, the threads it ran).
    ``held``: unit-seconds reserved for it; ``used``: unit-seconds of work done.
    ``sched_s``: wall time of the scheduling call that admitted it (not simulated time).
    """

    trajectory: str
    index: int
    kind: str
    pool: str
    node: str
    units: int
    submitted: float
    started: float
    finished: float
    queue: float
    exec: float
    overhead: float
    held: float
    used: float
    loaded: bool = False
    sched_s: float = 0.0

    @property
    def total(self) -> float:
        """The ACT: ``finished - submitted``."""
        return self.finished - self.submitted

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict, with ``total`` added."""
        return {**asdict(self), "total": self.total}


@dataclass(frozen=True)
class Allocation:
    """Concrete units of ``pool`` held by one action from ``start`` to ``end``."""

    pool: str
    units: tuple[int, ...]
    start: float
    end: float


@dataclass
class RunResult:
    """Everything one simulated run of one system on one workload produced."""

    system: str
    workload: str
    point: dict[str, Any]
    costs: str = ""
    seed: int = 0
    same_as: str = ""
    """The preset whose run this one is, when both charge this system the same costs."""
    records: list[ActionRecord] = field(default_factory=list)
    allocations: list[Allocation] = field(default_factory=list)
    capacity: dict[str, float] = field(default_factory=dict)
    peak_share: dict[str, float] = field(default_factory=dict)
    trajectory_times: dict[str, float] = field(default_factory=dict)
    step_times: list[float] = field(default_factory=list)
    reserved: float = 0.0
    makespan: float = 0.0
    decide_calls: int = 0
    decide_s: float = 0.0
    wall_s: float = 0.0

    def timeline(self) -> list[tuple[Any, ...]]:
        """The simulated outcome without wall-clock measurements (for determinism checks)."""
        return [
            (r.trajectory, r.index, r.node, r.units, r.submitted, r.started, r.finished,
             r.queue, r.exec, r.overhead)
            for r in self.records
        ]
