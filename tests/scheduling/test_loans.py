"""Core loans on plain data: a short job the decision leaves waiting borrows a core of a running
job, who lends and who never does, and the starvation bound is left as it was."""

from __future__ import annotations

import pytest

from tangram_celery.scheduling import (
    Core,
    CpuPool,
    Job,
    RobustConfig,
    RobustPolicy,
    RunningJob,
    Snapshot,
    decide_robust,
)
from tangram_celery.scheduling.lending import (
    Holder,
    Loan,
    LoanConfig,
    lender_speed,
    plan_loans,
    slowed,
)
from tangram_celery.scheduling.robust import loan_config

CPU = "cpu"


def fixed(job_id: str, units: int, duration: float | None, at: float = 0.0) -> Job:
    return Job(job_id, CPU, ((units, duration),), submitted_at=at, elastic=False)


def amdahl(job_id: str, t1: float, parallel: float, most: int, at: float = 0.0) -> Job:
    options = tuple((m, t1 * ((1 - parallel) + parallel / m)) for m in range(1, most + 1))
    return Job(job_id, CPU, options, submitted_at=at)


def held(job_id: str, units: range | tuple[int, ...], finish: float | None,
         lent: tuple[int, ...] = (), lends: bool = True) -> Holder:
    return Holder(job_id, tuple(units), finish, lent, lends)


# --- the idea changes the decision ---------------------------------------------------------

def full_node() -> tuple[Snapshot, list[Holder]]:
    """8 cores, all held by one elastic test run until t = 20; a 0.3 s exec arrives at t = 1."""
    snapshot = Snapshot(1.0, (fixed("exec", 1, 0.3, at=1.0),), (CpuPool(CPU, (), 8),),
                        (RunningJob("tests", CPU, 8, 20.0),))
    return snapshot, [held("tests", range(8), 20.0)]


def test_a_short_job_left_waiting_borrows_a_core_instead_of_queueing() -> None:
    snapshot, holders = full_node()
    policy = RobustPolicy()
    decision = policy(snapshot)
    assert decision.starts == (), "no core is free: the decision leaves the exec waiting"
    waiting = [job for job in snapshot.waiting if decision.units_of(job.job_id) is None]
    assert policy.lend(waiting, holders, snapshot.now) == (Loan("exec", "tests", (7,)),)
    without = RobustPolicy(RobustConfig(loans=False))
    without(snapshot)
    assert without.lend(waiting, holders, snapshot.now) == ()


def test_a_short_job_behind_a_blocked_head_borrows_rather_than_delay_it() -> None:
    """8 cores, 6 held by a long-lived elastic run, 2 free; the head needs 8 by t = 10 (EASY
    keeps the 2 free cores for it), so a short job that would outlast t = 10 may not backfill;
    it borrows from the running job instead and the head's cores stay free."""
    running = (RunningJob("r", CPU, 6, 10.0),)
    waiting = (fixed("head", 8, 100.0), fixed("short", 1, 9.0, at=1.0))
    snapshot = Snapshot(2.0, waiting, (CpuPool(CPU, (Core(6), Core(7)), 8),), running)
    config = RobustConfig(cap=False, reserve=False, horizon=False)
    assert decide_robust(snapshot, config=config).starts == ()
    loans = plan_loans(waiting, [held("r", range(6), 10.0)], 2.0, loan_config(config))
    assert loans == (Loan("short", "r", (5,)),)


# --- who borrows -------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("job", "borrows"),
    [
        (fixed("exec", 1, 0.3), True),
        (fixed("exec", 1, 59.0), True),  # short: inelastic, known, at most short_s (60 s)
        (fixed("exec", 1, 61.0), False),  # long
        (fixed("exec", 1, None), False),  # unknown duration: long
        (amdahl("tests", 8.0, 0.9, 4), False),  # elastic
        (fixed("pair", 2, 0.5), True),  # a short job of two cores takes two
    ],
)
def test_only_short_jobs_borrow(job: Job, borrows: bool) -> None:
    loans = plan_loans([job], [held("tests", range(8), 20.0)], 0.0)
    assert bool(loans) == borrows
    if borrows:
        assert loans[0].units == tuple(range(8 - job.minimum, 8))


def test_only_the_jobs_allowed_to_borrow_do() -> None:
    """A worker lends at a job's arrival only: the caller names who may borrow."""
    waiting = [fixed("old", 1, 0.3), fixed("new", 1, 0.3, at=1.0)]
    loans = plan_loans(waiting, [held("tests", range(8), 20.0)], 1.0, may_borrow={"new"})
    assert [loan.borrower for loan in loans] == ["new"]


def test_no_loans_while_a_job_is_overdue() -> None:
    """A loan slows a running job, so it could delay the start of an overdue head waiting for
    its cores; while one waits, short jobs queue as before (the starvation bound holds)."""
    holders = [held("tests", range(8), 20.0)]
    head = amdahl("head", 80.0, 0.9, 8, at=0.0)
    short = fixed("exec", 1, 0.3, at=59.0)
    assert plan_loans([head, short], holders, 59.5) == (Loan("exec", "tests", (7,)),)
    assert plan_loans([head, short], holders, 60.0) == ()
    patient = LoanConfig(max_bypass_s=100.0)
    assert plan_loans([head, short], holders, 60.0, patient) != ()


# --- who lends ---------------------------------------------------------------------------

def test_a_lender_keeps_at_least_one_core() -> None:
    shorts = [fixed(f"s{i}", 1, 0.3) for i in range(4)]
    loans = plan_loans(shorts, [held("two", (0, 1), 20.0)], 0.0)
    assert loans == (Loan("s0", "two", (1,)),), "two cores lend one, then none is left to lend"
    assert plan_loans(shorts, [held("one", (0,), 20.0)], 0.0) == ()
    assert plan_loans(shorts, [held("two", (0, 1), 20.0)], 0.0, LoanConfig(keep=2)) == ()


def test_short_jobs_borrowers_and_ended_jobs_never_lend() -> None:
    policy = RobustPolicy()
    snapshot = Snapshot(0.0, (fixed("s", 2, 0.5),), (CpuPool(CPU, (Core(0), Core(1)), 2),))
    assert policy(snapshot).units_of("s") == (0, 1)
    exec_job = [fixed("exec", 1, 0.3, at=0.1)]
    assert policy.lend(exec_job, [held("s", (0, 1), 0.5)], 0.1) == (), "started as short"
    assert plan_loans(exec_job, [held("x", (0, 1), 0.5, lends=False)], 0.1) == ()


def test_many_short_jobs_spread_over_the_lenders_with_most_cores_left() -> None:
    """Each loan goes where it costs the least delay (k / a of the lender's speed), so the
    loans spread: the 8-core job lends until it has fewer cores left than the 4-core one
    (ties go to the lower id)."""
    holders = [held("big", range(8), 30.0), held("small", range(8, 12), 30.0)]
    shorts = [fixed(f"s{i}", 1, 0.3) for i in range(6)]
    lenders = [loan.lender for loan in plan_loans(shorts, holders, 0.0)]
    assert lenders == ["big", "big", "big", "big", "big", "small"]


def test_a_lender_that_outlasts_the_borrower_comes_first() -> None:
    """A lender that ends before its borrower holds all its cores until the loan ends, so the
    one expected to outlast the borrower lends even though it has fewer cores."""
    holders = [held("ends-soon", range(16), 1.0), held("outlasts", range(16, 20), 50.0)]
    assert plan_loans([fixed("exec", 1, 5.0)], holders, 0.0)[0].lender == "outlasts"
    brief = plan_loans([fixed("exec", 1, 0.5)], holders, 0.0)
    assert brief[0].lender == "ends-soon", "both outlast a 0.5 s job: the larger one lends"


def test_if_every_lender_ends_first_the_least_idle_hold_lends() -> None:
    """No lender outlasts a 10 s job: 16 cores ending in 4 s would hold 16 x 6 core-seconds
    idle, 4 cores ending in 2 s only 4 x 8."""
    holders = [held("wide", range(16), 4.0), held("narrow", range(16, 20), 2.0)]
    assert plan_loans([fixed("exec", 1, 10.0)], holders, 0.0)[0].lender == "narrow"


def test_lent_cores_are_not_lent_twice() -> None:
    holders = [held("tests", range(4), 20.0, lent=(3,))]
    assert plan_loans([fixed("exec", 1, 0.3)], holders, 0.0) == (Loan("exec", "tests", (2,)),)


def test_a_lender_slows_by_the_share_of_cores_it_lends() -> None:
    """8 cores, 4 s of work left: lending 2 cores leaves 3/4 of its speed (5.33 s left);
    lending 2 more, half (8 s); getting them all back, 4 s again."""
    assert lender_speed(8, 0) == 1.0 and lender_speed(8, 2) == 0.75
    assert slowed(4.0, 0.0, 8, 0, 2) == pytest.approx(16 / 3)
    assert slowed(16 / 3, 0.0, 8, 2, 4) == pytest.approx(8.0)
    assert slowed(8.0, 0.0, 8, 4, 0) == pytest.approx(4.0)
    assert slowed(None, 0.0, 8, 0, 2) is None
