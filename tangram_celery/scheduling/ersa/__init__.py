"""Elastic resource scheduling (the ARL-Tangram algorithm): `decide(snapshot) -> Decision`.

At one scheduling point:

1. Order the waiting jobs (`SchedulerConfig.ordering`, FCFS by default).
2. Candidates: the longest prefix of that order that fits with every job at its minimum, placed
   one by one on its pool's topology (so GPU chunk fragmentation counts, not only totals).
   Jobs that no pool could ever serve are reported as unplaceable and skipped.
3. Per pool, candidates that are not elastic (unknown or single-option) start at their minimum.
4. The elastic candidates of a pool are settled by greedy eviction: admit all of them, then keep
   evicting the last one while the objective strictly falls (the first candidate always stays).
   The objective of admitting the first K is the sum of ACTs (time waited so far + expected
   duration) of every job of the pool that is admitted or still waiting:
   * admitted elastic candidates get the DP's optimal discrete allocation of the units left by
     the inelastic ones (least total duration; ties: see `dp`);
   * every still-waiting job (evicted candidates, then the rest of the queue) is placed in order,
     at its minimum, on a completion-time heap of the pool's units, seeded with running jobs'
     and admitted jobs' expected finishes (units left free are free now); its start is the
     time the units it needs are free. The first waiting job may take any of its first `depth`
     allowed unit counts; the estimate keeps the best.

Unknown durations are replaced by `fallback_duration` in the estimate. The heap counts units
(no topology) and caps a request at the pool's unit count. Objectives are computed in integer
ticks (`dp.RESOLUTION`, relative to `now`), so they are exact and do not depend on summation
order; the admitted part is the DP's total plus the candidates' waited time, O(1) per step.
"""

from __future__ import annotations

from tangram_celery.scheduling.ersa.allocator import decide, settle, settle_queue
from tangram_celery.scheduling.ersa.config import SchedulerConfig
from tangram_celery.scheduling.ersa.queue import Band, Entry, Queue, queue_entry

__all__ = [
    "Band",
    "Entry",
    "Queue",
    "SchedulerConfig",
    "decide",
    "queue_entry",
    "settle",
    "settle_queue",
]
