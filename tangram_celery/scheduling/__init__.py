"""Pure elastic scheduling policy: plain data in, a `Decision` out (no Celery, Redis or Triton).

`decide` implements the ARL-Tangram algorithm over topology-aware pools (`topology`) with a
vectorised prefix DP (`dp`); `DurationModel` learns expected durations online; `Fcfs` and
`ShortestFirst` are the queue orderings. `decide_robust` (`RobustPolicy` with its state) is
tangram's default: the same allocator steered by a `Demand` forecast (`DemandTracker`): a
load-aware DoP cap, a reserve for short jobs and EASY backfilling with a starvation bound.

Building a `Job` from an action: `key` is the pool of the action's key elastic resource;
the allowed unit counts come from its cost vector (a range [min, max] gives min..max, a
discrete set such as {1, 2, 4, 8} gives itself, a fixed amount gives one count); durations
come from `DurationModel.options((kind, key), allowed)`, or from a profiled T1 and E(m) with
`options_from_elasticity` (T1 / (E(m) * m)); set `elastic=False` when the action declares no
elasticity. Unknown durations (None) make the job inelastic: it is admitted at its minimum.

May import: nothing of tangram_celery; it needs the standard library and numpy only.
"""

from tangram_celery.scheduling.demand import Demand, DemandConfig, DemandTracker
from tangram_celery.scheduling.ersa import SchedulerConfig, decide, settle
from tangram_celery.scheduling.estimator import DurationModel, EstimatorConfig, Signature
from tangram_celery.scheduling.ordering import Fcfs, Ordering, ShortestFirst
from tangram_celery.scheduling.robust import Outlook, RobustConfig, RobustPolicy, decide_robust
from tangram_celery.scheduling.types import (
    Core,
    CpuPool,
    Decision,
    GpuPool,
    GroupOutcome,
    Job,
    Option,
    Pool,
    RunningJob,
    Snapshot,
    Start,
    options_from_elasticity,
)

__all__ = [
    "Core",
    "CpuPool",
    "Decision",
    "Demand",
    "DemandConfig",
    "DemandTracker",
    "DurationModel",
    "EstimatorConfig",
    "Fcfs",
    "GpuPool",
    "GroupOutcome",
    "Job",
    "Option",
    "Ordering",
    "Outlook",
    "Pool",
    "RobustConfig",
    "RobustPolicy",
    "RunningJob",
    "SchedulerConfig",
    "ShortestFirst",
    "Signature",
    "Snapshot",
    "Start",
    "decide",
    "decide_robust",
    "options_from_elasticity",
    "settle",
]
