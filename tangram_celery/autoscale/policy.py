"""Pure pool-sizing policy: how many members each pool should have, and why.

One call of :func:`decide` takes plain data gathered in one controller tick (one
:class:`PoolLoad` per pool, the :class:`Budget` and the :class:`ScalingConfig`) and returns a
:class:`Decision` of :class:`PoolTarget` s. No I/O, no clock, no Celery or Redis imports.

Sizing rules:

* **Demand is predicted work, not queue length.** A pool needs the units its running actions hold
  plus enough units to clear its predicted queued work (sum of expected unit-seconds of the ready
  *and* prefetched-not-started messages) within ``target_wait_s``. Queued actions without an
  estimate count at the pool's recent mean execution time (else ``fallback_duration_s``).
  Ten queued 1 ms actions do not grow a pool; three queued one-minute test runs do.
* **Recent ACT corrects the estimate.** When the recent mean queueing time exceeds
  ``queue_slo_s`` while work is still queued, the pool gets at least one member more.
* **Scale up at once** (by at least a factor ``min_growth``, so a burst that pins trajectories
  finds room early); **scale down only after ``down_hold_s``** since the pool's last change, only
  when demand fell below ``low_water`` of the smaller size (hysteresis band), and never below the
  members that running actions hold.
* **Budget.** Minimums first, then the floors held by running actions, then the remaining units
  of each resource go one member at a time to the pool with the most predicted work per unit it
  would hold (competing pools share fairly). A pool never exceeds its cap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

UP, DOWN, HOLD = "up", "down", "hold"


@dataclass(frozen=True)
class PoolLoad:
    """One pool as seen in one tick.

    ``size`` is in members (CPU node workers, GPU pool workers); each member holds
    ``member_units`` units of ``resource`` (cores, GPUs). ``ready`` counts the messages in every
    priority sub-list, ``prefetched`` those held by workers but not started. ``predicted_work_s``
    is the expected unit-seconds of the ``ready + prefetched - unknown`` messages with an
    estimate. ``recent_queue_s`` / ``recent_exec_s`` are recent mean ACT parts (0 when none).
    ``memory_mb`` is what the pool's trajectories hold (reserved on live members) plus what
    ``memory_waiting`` more trajectories wait for; with ``member_memory_mb`` (one member's
    memory; 0: not counted) the pool is grown to hold it all (within the budget), and never
    shrunk below that.
    """

    pool: str
    resource: str
    member_units: int
    size: int
    ready: int = 0
    prefetched: int = 0
    running: int = 0
    running_units: int = 0
    predicted_work_s: float = 0.0
    unknown: int = 0
    recent_queue_s: float = 0.0
    recent_exec_s: float = 0.0
    since_scale_s: float = math.inf
    memory_mb: float = 0.0
    memory_waiting: int = 0
    member_memory_mb: float = 0.0

    @property
    def queued(self) -> int:
        """Messages waiting to start: ready plus prefetched."""
        return self.ready + self.prefetched


@dataclass(frozen=True)
class PoolLimits:
    """A pool's minimum and cap, in members."""

    minimum: int = 0
    maximum: int = 1_000_000


@dataclass(frozen=True)
class Budget:
    """Units of each resource all pools share (``{"cpu": 16, "gpu": 8}``) and per-pool limits.

    A resource missing from ``totals`` is unlimited; a pool missing from ``limits`` gets the
    default :class:`PoolLimits`.
    """

    totals: Mapping[str, int] = field(default_factory=dict)
    limits: Mapping[str, PoolLimits] = field(default_factory=dict)

    def limit(self, pool: str) -> PoolLimits:
        """The limits of ``pool``."""
        return self.limits.get(pool, PoolLimits())


@dataclass(frozen=True)
class ScalingConfig:
    """Tunables of :func:`decide` (see the module docstring)."""

    target_wait_s: float = 2.0
    down_hold_s: float = 20.0
    low_water: float = 0.6
    queue_slo_s: float = 5.0
    fallback_duration_s: float = 1.0
    min_growth: float = 1.0

    def __post_init__(self) -> None:
        if self.target_wait_s <= 0 or self.fallback_duration_s <= 0:
            raise ValueError("target_wait_s and fallback_duration_s must be positive")
        if not 0 < self.low_water <= 1:
            raise ValueError("low_water must lie in (0, 1]")
        if self.down_hold_s < 0 or self.queue_slo_s <= 0:
            raise ValueError("down_hold_s must be >= 0 and queue_slo_s > 0")
        if self.min_growth < 1:
            raise ValueError("min_growth must be >= 1")


@dataclass(frozen=True)
class PoolTarget:
    """The decision for one pool: its target size, the direction, and why."""

    pool: str
    current: int
    target: int
    action: str
    reason: str
    demand_units: float
    wanted: int

    def describe(self) -> str:
        """One log line."""
        return (f"{self.pool}: {self.current} -> {self.target} ({self.action}; wanted "
                f"{self.wanted}, demand {self.demand_units:.2f} units): {self.reason}")


@dataclass(frozen=True)
class Decision:
    """Targets for every pool of one tick."""

    targets: tuple[PoolTarget, ...]

    def target(self, pool: str) -> PoolTarget | None:
        """The target of ``pool``, if it was decided."""
        return next((t for t in self.targets if t.pool == pool), None)

    def changes(self) -> tuple[PoolTarget, ...]:
        """Only the pools whose size changes."""
        return tuple(t for t in self.targets if t.target != t.current)


@dataclass(frozen=True)
class _Want:
    """A pool's unconstrained wish before the budget is shared."""

    load: PoolLoad
    demand: float
    wanted: int
    floor: int
    reason: str


def predicted_work(load: PoolLoad, config: ScalingConfig) -> float:
    """Unit-seconds queued: estimated work plus unknown messages at the recent mean duration."""
    per_unknown = load.recent_exec_s if load.recent_exec_s > 0 else config.fallback_duration_s
    return load.predicted_work_s + load.unknown * per_unknown


def demand_units(load: PoolLoad, config: ScalingConfig) -> float:
    """Units needed: those held by running actions plus queued work over ``target_wait_s``."""
    return load.running_units + predicted_work(load, config) / config.target_wait_s


def members_for(units: float, member_units: int) -> int:
    """Members needed to hold ``units`` (at least 0)."""
    return max(0, math.ceil(units / max(member_units, 1) - 1e-9))


def members_for_memory(load: PoolLoad) -> int:
    """Members whose memory holds the trajectories' (0 when memory is not counted)."""
    if load.member_memory_mb <= 0:
        return 0
    return max(0, math.ceil(load.memory_mb / load.member_memory_mb - 1e-9))


def wish(load: PoolLoad, limits: PoolLimits, config: ScalingConfig) -> _Want:
    """What one pool would like, ignoring the shared budget, with its reason."""
    demand = demand_units(load, config)
    by_memory = members_for_memory(load)
    floor = max(limits.minimum, members_for(load.running_units, load.member_units))
    by_units = members_for(demand, load.member_units)
    needed = max(by_units, floor, by_memory)
    late = load.queued > 0 and load.recent_queue_s > config.queue_slo_s
    if late and needed <= load.size:
        needed, why = load.size + 1, (f"recent queueing {load.recent_queue_s:.2f}s > SLO "
                                      f"{config.queue_slo_s:g}s with {load.queued} queued")
    elif load.memory_waiting and by_memory > max(by_units, load.size):
        why = (f"{load.memory_waiting} trajectories wait for memory: {load.memory_mb:g} MB "
               f"held and asked over {load.member_memory_mb:g} MB per member")
    else:
        why = (f"{load.running_units} units running + {predicted_work(load, config):.2f} "
               f"unit-s queued ({load.queued} msgs) over {config.target_wait_s:g}s")
    if needed > load.size:
        needed = max(needed, math.ceil(load.size * config.min_growth - 1e-9))
        return _Want(load, demand, min(needed, limits.maximum), floor, "grow: " + why)
    shrink = max(members_for(demand / config.low_water, load.member_units), floor, by_memory)
    if shrink >= load.size:
        return _Want(load, demand, min(load.size, limits.maximum), floor, "steady: " + why)
    if load.since_scale_s < config.down_hold_s:
        return _Want(load, demand, min(load.size, limits.maximum), floor,
                     f"hold: would shrink to {shrink} but last change "
                     f"{load.since_scale_s:.1f}s ago < {config.down_hold_s:g}s")
    return _Want(load, demand, min(shrink, limits.maximum), floor, "shrink: " + why)


def decide(
    loads: Sequence[PoolLoad], budget: Budget, config: ScalingConfig | None = None
) -> Decision:
    """Target sizes for every pool within the shared budget (see the module docstring)."""
    config = config or ScalingConfig()
    wants = [wish(load, budget.limit(load.pool), config) for load in loads]
    granted = _share(wants, budget)
    return Decision(tuple(_target(w, granted[w.load.pool]) for w in wants))


def _share(wants: Sequence[_Want], budget: Budget) -> dict[str, int]:
    """Grant members per pool: floors first, then the rest by predicted work per unit."""
    granted = {w.load.pool: w.floor for w in wants}
    left = {r: total - sum(w.floor * w.load.member_units for w in wants
                           if w.load.resource == r)
            for r, total in budget.totals.items()}
    while True:
        open_ = [w for w in wants if granted[w.load.pool] < w.wanted
                 and left.get(w.load.resource, math.inf) >= w.load.member_units]
        if not open_:
            return granted
        best = max(open_, key=lambda w: (_pressure(w, granted[w.load.pool]), w.load.pool))
        granted[best.load.pool] += 1
        if best.load.resource in left:
            left[best.load.resource] -= best.load.member_units


def _pressure(want: _Want, members: int) -> float:
    """Demand per unit the pool would hold with ``members``: who needs the next member most."""
    return want.demand / max(members * want.load.member_units, 1)


def _target(want: _Want, granted: int) -> PoolTarget:
    load = want.load
    reason = want.reason
    if granted < want.wanted:
        reason += f"; budget allows {granted} of {want.wanted}"
    action = UP if granted > load.size else DOWN if granted < load.size else HOLD
    return PoolTarget(load.pool, load.size, granted, action, reason, want.demand, want.wanted)
