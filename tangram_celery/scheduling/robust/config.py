"""Settings of the robust scheduler (`RobustConfig`), and the loan settings that go with them."""

from __future__ import annotations

from dataclasses import dataclass, field

from tangram_celery.scheduling.demand import DemandConfig
from tangram_celery.scheduling.ersa import SchedulerConfig
from tangram_celery.scheduling.lending import LoanConfig


@dataclass(frozen=True)
class RobustConfig:
    """Settings of `decide_robust`.

    `base`: the paper's allocator's settings (depth, fallback duration, ordering).
    `demand`: the forecast's settings; its `short_s` also decides which jobs are short.
    `cap`, `reserve`, `backfill`, `horizon`: switch each idea on or off.
    `utilisation`: how many of the units left to elastic work the cap's queue model counts
    (above 1: the pool absorbs short bursts). `burstiness`: factor on the model's wait.
    `max_units`: a hard cap on any elastic job (None: none).
    `reserve_z`: safety factor of the reserve (standard deviations of short load).
    `max_reserve`: the largest share of a pool the reserve may take.
    `max_bypass_s`: after waiting this long a job is overtaken by nothing (starvation bound).
    `loans`: short jobs left waiting borrow cores of running jobs (`loan_config`).
    `floor`: the fewest units an elastic job starts on (within its minimum and the cap; 1:
    none), so a test run does not take the one core an exec action just freed.
    """

    base: SchedulerConfig = field(default_factory=SchedulerConfig)
    demand: DemandConfig = field(default_factory=DemandConfig)
    cap: bool = True
    reserve: bool = True
    backfill: bool = True
    utilisation: float = 1.2
    reserve_z: float = 0.0
    max_reserve: float = 0.5
    max_bypass_s: float = 60.0
    horizon: bool = True
    max_units: int | None = None
    burstiness: float = 4.0
    loans: bool = True
    floor: int = 1

    def __post_init__(self) -> None:
        if not self.utilisation > 0 or not 0 <= self.max_reserve < 1:
            raise ValueError("utilisation must be positive and max_reserve in [0, 1)")
        if self.reserve_z < 0 or self.max_bypass_s < 0:
            raise ValueError("reserve_z and max_bypass_s must be >= 0")
        if self.floor < 1:
            raise ValueError("floor must be at least 1 unit")


def loan_config(config: RobustConfig) -> LoanConfig:
    """The loan settings that go with `config`: the same short threshold and overdue age."""
    return LoanConfig(config.loans, config.demand.short_s, config.max_bypass_s,
                      fallback_s=config.base.fallback_duration)
