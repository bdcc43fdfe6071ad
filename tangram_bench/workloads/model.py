"""The plain data of a benchmark workload: trajectories of timed actions, GPU services, API quotas.

A workload is what the simulator and the real-stack runner replay. Each trajectory is a sequence
of actions; before each one the LLM "thinks" for ``think_s`` seconds, then the action is
submitted and the next think starts only when it completes. An action's duration on ``m`` units
of its key resource follows Amdahl's law, ``t1 * ((1 - p) + p / m)`` (so ``E(m) = S(m) / m``
with ``S(m) = 1 / ((1 - p) + p / m)``); ``t1`` is the one-unit duration even where one unit is
not an allowed count (a large model whose smallest tensor-parallel degree is 4).
"""

from __future__ import annotations

from dataclasses import dataclass

from tangram_celery.action.model import KIND_POOL


@dataclass(frozen=True)
class ActionSpec:
    """One action of a trajectory, as plain data.

    ``kind``: ``exec``, ``test_run`` (CPU), ``reward`` (GPU) or ``api``. ``units``: the allowed
    unit counts of the key resource, ascending (cores, GPUs; ``(1,)`` for API calls).
    ``parallel``: Amdahl's parallel fraction (0: inelastic). ``service``: the GPU model or API
    name. ``think_s``: LLM time before the action is submitted. ``signature``: what the
    submitter names the action by (a GRPO group's prompt; empty: none), the key a duration
    model learns under.
    """

    kind: str
    t1: float
    think_s: float = 0.0
    units: tuple[int, ...] = (1,)
    parallel: float = 0.0
    service: str = ""
    signature: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KIND_POOL:
            raise ValueError(f"unknown action kind {self.kind!r}; one of {sorted(KIND_POOL)}")
        if not self.t1 > 0 or self.think_s < 0:
            raise ValueError("t1 must be positive and think_s non-negative")
        if not self.units or self.units[0] < 1 or list(self.units) != sorted(set(self.units)):
            raise ValueError("units must be positive, distinct and ascending")
        if not 0.0 <= self.parallel <= 1.0:
            raise ValueError("parallel must lie in [0, 1]")

    @property
    def pool(self) -> str:
        """The pool type that runs it: ``cpu``, ``gpu`` or ``api``."""
        return KIND_POOL[self.kind]

    @property
    def elastic(self) -> bool:
        """Whether more units make it faster (several allowed counts, parallel fraction > 0)."""
        return len(self.units) > 1 and self.parallel > 0.0

    def duration(self, units: float) -> float:
        """Seconds on ``units`` units: ``t1 * ((1 - p) + p / units)``."""
        return self.t1 * ((1.0 - self.parallel) + self.parallel / units)

    def speedup(self, units: float) -> float:
        """Amdahl's speed-up ``S(m) = t1 / duration(m)``: the average busy units at ``m``."""
        return self.t1 / self.duration(units)


@dataclass(frozen=True)
class Trajectory:
    """One rollout: ``actions`` in order, starting ``start_s`` after its RL step starts."""

    id: str
    actions: tuple[ActionSpec, ...]
    start_s: float = 0.0
    step: int = 0


@dataclass(frozen=True)
class GpuService:
    """A reward model or teacher: its allowed parallelisms and the size of its weights.

    Per GPU it needs ``weights_gb / dop * (1 + kv_fraction)`` of memory at parallelism ``dop``.
    """

    name: str
    dops: tuple[int, ...]
    weights_gb: float
    kv_fraction: float = 0.2

    def memory_mb(self, dop: int) -> int:
        """Memory per GPU (MB) when placed on ``dop`` GPUs."""
        return int(self.weights_gb * 1000 / dop * (1.0 + self.kv_fraction))


@dataclass(frozen=True)
class ApiLimit:
    """A quota-limited API: at most ``concurrency`` calls in flight and ``qps`` starts a second."""

    name: str
    concurrency: int
    qps: float


@dataclass(frozen=True)
class Workload:
    """Trajectories plus the services and APIs they call. Steps run one after another:
    step ``s + 1`` starts ``step_gap_s`` after the last action of step ``s`` completes."""

    name: str
    trajectories: tuple[Trajectory, ...]
    services: tuple[GpuService, ...] = ()
    apis: tuple[ApiLimit, ...] = ()
    step_gap_s: float = 0.0

    def __post_init__(self) -> None:
        ids = [t.id for t in self.trajectories]
        if len(set(ids)) != len(ids):
            raise ValueError("trajectory ids must be unique")
        names = {s.name for s in self.services} | {a.name for a in self.apis}
        for trajectory in self.trajectories:
            if not trajectory.actions:
                raise ValueError(f"trajectory {trajectory.id}: give it at least one action")
            for action in trajectory.actions:
                if action.pool != "cpu" and action.service not in names:
                    raise ValueError(
                        f"trajectory {trajectory.id}: {action.kind} action calls unknown "
                        f"service {action.service!r}; declare it in the workload"
                    )

    @property
    def steps(self) -> int:
        """How many RL steps the workload spans."""
        return 1 + max((t.step for t in self.trajectories), default=0)

    def service(self, name: str) -> GpuService:
        """The GPU service called ``name``."""
        for service in self.services:
            if service.name == name:
                return service
        raise KeyError(name)

    def api(self, name: str) -> ApiLimit:
        """The API quota called ``name``."""
        for api in self.apis:
            if api.name == name:
                return api
        raise KeyError(name)

    def unqueued_external_s(self) -> float | None:
        """The least external time per trajectory any scheduler on any number of cores can
        give: every action alone at its largest allowed count, nothing waiting, no overhead
        (the mean over trajectories of their actions' durations so); None when an action is
        not a CPU action (GPU and API calls have no such bound here)."""
        total = 0.0
        for trajectory in self.trajectories:
            for action in trajectory.actions:
                if action.pool != "cpu":
                    return None
                total += action.duration(max(action.units))
        return total / len(self.trajectories) if self.trajectories else None

    def action_count(self) -> int:
        """How many actions the workload holds."""
        return sum(len(t.actions) for t in self.trajectories)
