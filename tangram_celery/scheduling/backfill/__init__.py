"""EASY-style admission over a pool's unit count, with a reserve for short jobs (pure).

`plan` walks the queue in order and chooses, at their minimums, the jobs that start now:

* **FCFS until the head blocks.** A short job needs free units; a long (or elastic) job needs
  *long room*: free units that leave `reserve` units free or held by short jobs, i.e.
  ``total - long_held - max(short_held, reserve)``. The first job that does not fit is the
  head.
* **The head's shadow.** From the running jobs' expected finishes (and the jobs just chosen,
  at their minimums), the earliest time `shadow` at which the head would fit, and what is
  held at that time.
* **Backfilling.** A later *short* job may start ahead of the head when units are free and it
  cannot delay the head's start: it is expected to end by `shadow`, or the head still fits at
  `shadow` with it running (EASY's "extra units"; reserve units the head may not use count
  here). Long jobs never overtake the head.
* **Starvation bound.** A head that has waited `max_bypass_s` since it was submitted is
  *overdue*: nothing overtakes it and the reserve is waived for it. From then on it starts as
  soon as its minimum is free, so it starts at the latest `max_bypass_s` plus the longest
  run of any job started before that (however many short jobs keep arriving). Expected
  durations that turn out wrong can delay it only until it is overdue.

Counts only: pools whose fit depends on topology (GPU chunks) are not planned here.
"""

from __future__ import annotations

from tangram_celery.scheduling.backfill.admission import Choice, Held, Plan, choose, plan
from tangram_celery.scheduling.backfill.horizon import Busy, Horizon, Shadow
from tangram_celery.scheduling.backfill.waiting import Waiting, new_waiting

__all__ = [
    "Busy",
    "Choice",
    "Held",
    "Horizon",
    "Plan",
    "Shadow",
    "Waiting",
    "choose",
    "new_waiting",
    "plan",
]
