"""Settings of the service-aware GPU scheduler (`ReplicaConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tangram_celery.scheduling.ersa import SchedulerConfig
from tangram_celery.scheduling.robust import RobustConfig


@dataclass(frozen=True)
class ReplicaConfig:
    """Settings of `decide_replicas`.

    `backlog_weight`: scale of the backlog term (0: every job takes its earliest completion).
    `max_bypass_s`: a job waiting this long is overtaken on its GPUs by nothing.
    `window`: the most jobs planned per pool at one point (the rest wait for the next).
    `fallback_duration`: seconds assumed where a duration or a running finish is unknown.
    `default_restore_s`: restore time of a service the pool does not describe.
    `base`: the paper's allocator's settings, for pools that are not GPU pools.
    `cap`: the settings of `ReplicaPolicy`'s load-aware DoP cap (None: no cap).
    `affinity`, `backfill`, `spare`: switch off waiting for a busy replica (a job then takes
    the best chunk free now), starting later jobs before a waiting one (strict FCFS), and the
    penalty for unloading a service later jobs need, to measure what each idea brings.
    """

    backlog_weight: float = 1.0
    max_bypass_s: float = 60.0
    window: int = 256
    fallback_duration: float = 1.0
    default_restore_s: float = 0.0
    base: SchedulerConfig = field(default_factory=SchedulerConfig)
    affinity: bool = True
    backfill: bool = True
    spare: bool = True
    cap: RobustConfig | None = field(default_factory=lambda: RobustConfig(utilisation=1.0))

    def __post_init__(self) -> None:
        if self.backlog_weight < 0 or self.max_bypass_s < 0 or self.default_restore_s < 0:
            raise ValueError("backlog_weight, max_bypass_s and default_restore_s must be >= 0")
        if self.window < 1 or not self.fallback_duration > 0:
            raise ValueError("window must be >= 1 and fallback_duration positive")
