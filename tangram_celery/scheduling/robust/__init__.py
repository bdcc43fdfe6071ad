"""The robust scheduler: the paper's allocator, steered by predicted demand (beyond the paper).

The paper's allocator (`ersa.decide`) is myopic: it gives every free unit to whoever waits now,
so under load later elastic jobs find the pool full, and short inelastic jobs wait behind long
ones holding many units. `decide_robust` keeps its DP and eviction, and changes what it is
given, from a `Demand` forecast per pool (see `demand`):

* **Load-aware DoP cap** (`dop_cap`): elastic jobs may take at most k units, k chosen from
  `CAPS` to minimise the predicted mean elastic ACT: an M/M/c queue whose servers are the
  units left to elastic work (the pool less the predicted short and long inelastic load,
  times `utilisation`) divided by k, whose service time is the mean expected duration at k
  and whose arrival rate is the predicted elastic rate (`predicted_act`). Light load: no cap;
  overload: the cap with the least load.
* **A reserve for short jobs** (`reserve_units`): ``ceil(a + z * sqrt(a))`` units, a the
  predicted units busy with short jobs (square-root staffing), at most `max_reserve` of the
  pool and never more than the forecast leaves idle with every elastic job at one unit (on a
  small node one rounded-up unit is a large share, and elastic work that alone fills the pool
  only queues longer), that long and elastic jobs leave free or held by short jobs.
* **Horizon start** (`backfill`): an elastic head that cannot get its cap now waits for more
  units only if that is expected to finish sooner, counting the wait once more for every
  non-short job it blocks; a head that starts now needs only its minimum (the paper's
  allocator then spreads the room up to the cap).
* **EASY backfilling with a starvation bound** (`backfill.plan`): short jobs may start ahead of
  a blocked head when that cannot delay its expected start; a head waiting `max_bypass_s` is
  overtaken by nothing.

The jobs chosen by the plan, and the units elastic jobs may share, are then handed to the
paper's allocator (`ersa.settle`), which spreads the long room over the elastic candidates with
its DP and eviction. Each idea has a switch (`RobustConfig`), so each can be measured alone.
Pools whose fit depends on topology (GPU chunks) get the paper's allocator unchanged.

* **Core loans** (`loans`, `RobustPolicy.lend`): a short job the decision leaves waiting
  starts at once on a core lent by a running job that is not short (an elastic test run, say)
  and stays queued; when the decision starts it, it moves onto its own cores
  (`tangram_celery.scheduling.lending`). Short jobs so never wait while some running job can
  spare a core, the decisions stay the ones above, and the lender runs slower while it lends.

`RobustPolicy` is the stateful callable the simulator and the node worker hold: it feeds a
`DemandTracker` and remembers which running jobs it started as short.
"""

from __future__ import annotations

from tangram_celery.scheduling.robust.config import RobustConfig, loan_config
from tangram_celery.scheduling.robust.limits import (
    dop_cap,
    elastic_cap,
    predicted_act,
    reserve_units,
)
from tangram_celery.scheduling.robust.policy import RobustPolicy, decide_robust
from tangram_celery.scheduling.robust.pool import Outlook

__all__ = [
    "Outlook",
    "RobustConfig",
    "RobustPolicy",
    "decide_robust",
    "dop_cap",
    "elastic_cap",
    "loan_config",
    "predicted_act",
    "reserve_units",
]
