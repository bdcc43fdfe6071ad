"""The robust scheduler's entry points: `decide_robust` over every pool, and `RobustPolicy`,
which keeps the forecast and the running short jobs between decisions."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from tangram_celery.scheduling.demand import DemandTracker, job_class
from tangram_celery.scheduling.lending import Holder, Loan, plan_loans
from tangram_celery.scheduling.robust.config import RobustConfig, loan_config
from tangram_celery.scheduling.robust.pool import Outlook, pool_decision
from tangram_celery.scheduling.types import Decision, Job, Snapshot


def decide_robust(
    snapshot: Snapshot, outlook: Outlook | None = None, config: RobustConfig | None = None
) -> Decision:
    """Which waiting jobs start now, on which units (see `robust`)."""
    config = config or RobustConfig()
    outlook = outlook or Outlook()
    ordered = config.base.ordering.order(snapshot.waiting, snapshot.now)
    names = {pool.name for pool in snapshot.pools}
    parts = [
        pool_decision(snapshot, pool, [j for j in ordered if j.key == pool.name], outlook,
                      config)
        for pool in snapshot.pools
    ]
    lost = tuple(job.job_id for job in ordered if job.key not in names)
    return Decision(
        tuple(start for part in parts for start in part.starts),
        tuple(job for part in parts for job in part.deferred),
        tuple(job for part in parts for job in part.unplaceable) + lost,
        tuple(group for part in parts for group in part.groups),
    )


class RobustPolicy:
    """The robust scheduler with its state: a callable from `Snapshot` to `Decision`.

    It feeds a `DemandTracker` with every snapshot and remembers which of the jobs it started
    are short, so the reserve can count them; the decision itself is `decide_robust`.
    """

    def __init__(self, config: RobustConfig | None = None) -> None:
        self.config = config or RobustConfig()
        self.tracker = DemandTracker(self.config.demand)
        self.short_running: set[str] = set()

    def __call__(self, snapshot: Snapshot) -> Decision:
        """The decision for one scheduling point."""
        demand = self.tracker.observe(snapshot)
        self.short_running &= {job.job_id for job in snapshot.running}
        outlook = Outlook(demand, frozenset(self.short_running))
        decision = decide_robust(snapshot, outlook, self.config)
        short_s = self.config.demand.short_s
        started = {start.job_id for start in decision.starts}
        self.short_running |= {job.job_id for job in snapshot.waiting
                               if job.job_id in started and job_class(job, short_s) == "short"}
        return decision

    def lend(self, waiting: Sequence[Job], holders: Sequence[Holder], now: float,
             may_borrow: Collection[str] | None = None) -> tuple[Loan, ...]:
        """Loans for the short jobs among `waiting` (left waiting by the last decision; only
        those in `may_borrow`, if given) from the running `holders`; the jobs it started as
        short never lend (`loans.plan_loans`)."""
        holders = [h if h.job_id not in self.short_running or not h.lends else
                   Holder(h.job_id, h.units, h.expected_finish, h.lent, False) for h in holders]
        return plan_loans(waiting, holders, now, loan_config(self.config), may_borrow)
