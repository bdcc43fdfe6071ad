"""Pluggable scheduling policies for the pooled systems, and how actions are shaped for them.

A :class:`Policy` has the shape of :func:`tangram_celery.scheduling.decide`: a snapshot of one
pool in, a :class:`~tangram_celery.scheduling.Decision` out. The simulator builds one policy
per pool (a CPU node, the GPU pool) from a factory, so a policy may keep per-pool state such as
arrival-rate estimates. Register a new one with :func:`register_policy` and run it as
``--systems tangram:<name>`` (or make it the default of ``tangram`` with ``--policy``).
Registered: ``robust`` (the default: tangram's load-robust scheduler), ``ersa`` (the paper's
allocator alone) and the ablations of ``robust`` in :data:`ABLATIONS`.

A :class:`Shape` turns an action into the options a policy sees: every allowed unit count
(``Elastic``), one fixed count (``FixedDop``, the paper's ablation), or the minimum
(``Minimum``, plain Celery). Shapes are applied before the policy, so fixed DoP and plain Celery
run through the very same ``decide`` (which admits single-option jobs at their minimum, FCFS).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from tangram_bench.workloads.model import ActionSpec
from tangram_celery.scheduling import Decision, Job, Option, SchedulerConfig, Snapshot, decide
from tangram_celery.scheduling.robust import RobustConfig, RobustPolicy


class Policy(Protocol):
    """A pool's scheduling policy: which waiting jobs start now, on which units."""

    def __call__(self, snapshot: Snapshot) -> Decision:
        """The decision for one scheduling point."""
        ...


PolicyFactory = Callable[[], Policy]
"""Builds one policy instance per pool."""


def ersa() -> Policy:
    """The paper's elastic scheduler as implemented in :mod:`tangram_celery.scheduling`."""
    return partial(decide, config=SchedulerConfig())


def robust(config: RobustConfig | None = None) -> PolicyFactory:
    """Tangram's robust scheduler (:mod:`tangram_celery.scheduling.robust`) with ``config``."""
    return partial(RobustPolicy, config or RobustConfig())


ABLATIONS: dict[str, RobustConfig] = {
    "robust-no-cap": RobustConfig(cap=False),
    "robust-no-reserve": RobustConfig(reserve=False),
    "robust-no-backfill": RobustConfig(backfill=False),
    "robust-no-horizon": RobustConfig(horizon=False),
    "robust-no-loans": RobustConfig(loans=False),
}
"""The robust scheduler with one idea switched off, to measure what each one brings."""

POLICIES: dict[str, PolicyFactory] = {
    "robust": robust(),
    "ersa": ersa,
    **{name: robust(config) for name, config in ABLATIONS.items()},
}
DEFAULT_POLICY = "robust"


def register_policy(name: str, factory: PolicyFactory) -> None:
    """Make a policy available to the simulator under ``name``."""
    POLICIES[name] = factory


def policy_factory(name: str) -> PolicyFactory:
    """The registered factory of ``name``."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; registered: {sorted(POLICIES)}") from None


class Shape(Protocol):
    """How a system presents an action to its policy."""

    def options(self, spec: ActionSpec) -> tuple[Option, ...]:
        """The (unit count, expected duration) options the policy may choose from."""
        ...

    def elastic(self, spec: ActionSpec) -> bool:
        """Whether the policy may give the action more than its minimum."""
        ...


@dataclass(frozen=True)
class Elastic:
    """Every allowed unit count, with its Amdahl duration (tangram)."""

    def options(self, spec: ActionSpec) -> tuple[Option, ...]:
        """All allowed counts."""
        return tuple((units, spec.duration(units)) for units in spec.units)

    def elastic(self, spec: ActionSpec) -> bool:
        """Elastic when the action is."""
        return spec.elastic


@dataclass(frozen=True)
class FixedDop:
    """Every elastic action at one fixed unit count: the largest allowed one <= ``dop``."""

    dop: int

    def options(self, spec: ActionSpec) -> tuple[Option, ...]:
        """One option."""
        if not spec.elastic:
            return ((spec.units[0], spec.duration(spec.units[0])),)
        units = max((u for u in spec.units if u <= self.dop), default=spec.units[0])
        return ((units, spec.duration(units)),)

    def elastic(self, spec: ActionSpec) -> bool:
        """Never elastic."""
        return False


@dataclass(frozen=True)
class Minimum:
    """Every action at its minimum unit count (plain Celery: one unit each)."""

    def options(self, spec: ActionSpec) -> tuple[Option, ...]:
        """The minimum only."""
        return ((spec.units[0], spec.duration(spec.units[0])),)

    def elastic(self, spec: ActionSpec) -> bool:
        """Never elastic."""
        return False


def job_for(job_id: str, key: str, spec: ActionSpec, submitted: float, shape: Shape,
            seen: Callable[[tuple[Option, ...]], tuple[Option, ...]] | None = None) -> Job:
    """The scheduler's view of an action under ``shape``; ``seen`` turns the shape's exact
    options into those the policy is told (see :mod:`.durations`)."""
    options = shape.options(spec)
    return Job(job_id, key, options if seen is None else seen(options), submitted,
               elastic=shape.elastic(spec), service=spec.service)
