"""Core loans: a short job that would queue runs now on a core of a running job (beyond the paper).

Static per-trajectory pods never queue an exec action: it runs in its own pod at once (slowed
only when its node's CPUs are oversubscribed). A pooled node with every core held, or with its
free cores kept for a blocked head, makes it wait. A *loan* closes that gap: a short job the
decision leaves waiting starts at once on `job.minimum` cores of one running job (the
*lender*), while it stays in the queue exactly as before; when the scheduler starts it, it
moves onto the cores it is given and the loan ends (or the loan ends with its run, if that
comes first). So the scheduler's decisions are its own, and a loan lasts about as long as the
job would have queued. The lender keeps running on the cores it has left: every core is held
by exactly one job at any instant (on a worker, the lender's cpuset shrinks and the
borrower's cgroup holds the lent core alone; see `tangram_celery.pools.cpu_pool.loans`), and the
lender pays for the loan by running slower while it lasts (`lender_speed`).

`plan_loans` chooses the lenders, pure over plain data:

* **Who borrows**: short jobs (`demand.job_class`) left waiting, in queue order, each taking
  its minimum from one lender; none while any job is overdue (has waited `max_bypass_s`), so
  a loan never slows the jobs an overdue head waits for (the starvation bound of `backfill`
  stays as it is).
* **Who lends**: running jobs that are not short and not borrowers, that keep at least `keep`
  cores of their own after the loan.
* **Which lender**: the least expected idle hold first (a lender of `m` cores expected to end
  `r` seconds from now, before a borrower of `d` seconds, may hold its `m` cores idle until
  the loan ends: at most `m * (d - r)` core-seconds; none for a lender that outlasts the
  borrower), then
  the least expected delay (a lender with `a` cores left lending `k` for `d` seconds loses
  `k / a` of its speed for `d`: about `d * k / a` seconds; the core-seconds a loan costs are
  about `d * k` whoever lends), then the latest expected finish, then the id.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from tangram_celery.scheduling.demand import job_class
from tangram_celery.scheduling.types import Job


@dataclass(frozen=True)
class LoanConfig:
    """Settings of `plan_loans`: whether loans happen, the short threshold (`short_s`, as in
    `DemandConfig`), the overdue age (`max_bypass_s`, as in `RobustConfig`), how many cores a
    lender keeps (`keep`, at least one) and the duration assumed where a borrower's is unknown
    (`fallback_s`)."""

    enabled: bool = True
    short_s: float = 60.0
    max_bypass_s: float = 60.0
    keep: int = 1
    fallback_s: float = 1.0

    def __post_init__(self) -> None:
        if self.keep < 1 or not self.short_s > 0 or self.max_bypass_s < 0:
            raise ValueError("keep must be >= 1, short_s positive and max_bypass_s >= 0")


@dataclass(frozen=True)
class Holder:
    """A running job as the loan plan sees it: the unit ids it was granted, its expected finish
    (None: unknown), the ids it has lent now, and whether it may lend at all (False for short
    jobs, borrowers and jobs that have finished but still hold their cores)."""

    job_id: str
    units: tuple[int, ...]
    expected_finish: float | None
    lent: tuple[int, ...] = ()
    lends: bool = True

    @property
    def left(self) -> tuple[int, ...]:
        """The ids it holds and has not lent, ascending."""
        lent = set(self.lent)
        return tuple(sorted(u for u in self.units if u not in lent))


@dataclass(frozen=True)
class Loan:
    """`borrower` runs now on `units`, lent by the running job `lender`."""

    borrower: str
    lender: str
    units: tuple[int, ...]


def plan_loans(
    waiting: Sequence[Job], holders: Iterable[Holder], now: float,
    config: LoanConfig | None = None, may_borrow: Collection[str] | None = None,
) -> tuple[Loan, ...]:
    """The loans for the jobs left `waiting` (in queue order) after this scheduling point's
    starts (see the module docstring); only jobs in `may_borrow` borrow, if given (a worker
    lends at a job's arrival only)."""
    config = config or LoanConfig()
    if not config.enabled:
        return ()
    if any(now - job.submitted_at >= config.max_bypass_s for job in waiting):
        return ()
    classes = [job_class(job, config.short_s) for job in waiting]
    state = {h.job_id: h for h in holders if h.lends}
    loans = []
    for job, kind in zip(waiting, classes, strict=True):
        if kind != "short" or not state or (may_borrow is not None
                                            and job.job_id not in may_borrow):
            continue
        duration = job.options[0][1]
        chosen = _lender(state.values(), job.minimum, config.fallback_s if duration is None
                         else duration, now, config.keep)
        if chosen is None:
            continue
        units = chosen.left[-job.minimum:]
        loans.append(Loan(job.job_id, chosen.job_id, units))
        finish = slowed(chosen.expected_finish, now, len(chosen.units), len(chosen.lent),
                        len(chosen.lent) + len(units))
        state[chosen.job_id] = Holder(chosen.job_id, chosen.units, finish,
                                      (*chosen.lent, *units), True)
    return tuple(loans)


def lender_speed(units: int, lent: int) -> float:
    """The speed of a job on `units` cores with `lent` of them lent, as a share of its full
    speed: the share of its cores it keeps. Its workers share the cores left, so every phase
    slows alike; under Amdahl's law the serial phase would lose nothing, so this charges the
    lender at least what a loan really costs it (the simulator charges it so)."""
    return (units - lent) / units


def slowed(expected_finish: float | None, now: float, units: int, lent: int, lending: int
           ) -> float | None:
    """A lender's expected finish after its lent cores go from `lent` to `lending` now: the
    work it has left at its old speed, done at its new one (`lender_speed`)."""
    if expected_finish is None:
        return None
    left = max(expected_finish - now, 0.0) * lender_speed(units, lent)
    return now + left / lender_speed(units, lending)


def _lender(holders: Iterable[Holder], units: int, duration: float, now: float,
            keep: int) -> Holder | None:
    """The best lender of `units` cores for `duration` seconds, or None."""
    best, best_key = None, None
    for holder in holders:
        left = len(holder.units) - len(holder.lent)
        if left - units < keep:
            continue
        remaining = math.inf if holder.expected_finish is None else holder.expected_finish - now
        idle = len(holder.units) * max(duration - remaining, 0.0)
        key = (idle, duration * units / left, -remaining, holder.job_id)
        if best_key is None or key < best_key:
            best, best_key = holder, key
    return best
