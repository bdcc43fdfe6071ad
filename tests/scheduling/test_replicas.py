"""The service-aware GPU scheduler on plain data: cache affinity, replica scaling, backfilling,
the backlog term, eviction choices and the starvation bound each change the decision where
they should (and the paper's allocator, for contrast, decides otherwise)."""

from __future__ import annotations

import math

import pytest

from tangram_celery.scheduling import (
    Core,
    CpuPool,
    Demand,
    GpuPool,
    Job,
    RobustConfig,
    RunningJob,
    Snapshot,
    decide,
)
from tangram_celery.scheduling.replicas import (
    Planner,
    ReplicaConfig,
    ReplicaPolicy,
    aligned_chunks,
    decide_replicas,
    gpu_cap,
)
from tangram_celery.scheduling.residency import Resident, service_name
from tangram_celery.scheduling.types import Service

GPU = "gpu"
GB = 1000


def pool(free: tuple[int, ...] | range, total: int = 8, node: int = 8,
         residents: tuple[Resident, ...] = (), services: tuple[Service, ...] = (),
         memory: int = 80 * GB) -> GpuPool:
    return GpuPool(GPU, tuple(free), total, node, residents, services, memory)


def job(job_id: str, service: str = "", options: tuple[tuple[int, float | None], ...] = ((1, 2.0),),
        at: float = 0.0) -> Job:
    return Job(job_id, GPU, options, at, service=service)


def resident(service: str, chunk: tuple[int, ...], mb: int = 10 * GB, used: int = 1) -> Resident:
    return Resident(service_name(service, chunk), service, chunk, mb, used)


def svc(name: str, restore: float, mb: int = 10 * GB,
        dops: tuple[int, ...] = (1, 2, 4, 8)) -> Service:
    return Service(name, tuple((d, mb) for d in dops), tuple((d, restore) for d in dops))


def busy(job_id: str, ids: tuple[int, ...], finish: float, service: str = "") -> RunningJob:
    return RunningJob(job_id, GPU, len(ids), finish, ids, service)


def starts(now: float, jobs: list[Job], gpus: GpuPool, running: tuple[RunningJob, ...] = (),
           **config: float) -> dict[str, tuple[int, ...]]:
    snapshot = Snapshot(now, tuple(jobs), (gpus,), running)
    decision = decide_replicas(snapshot, ReplicaConfig(**config))  # type: ignore[arg-type]
    return {start.job_id: start.units for start in decision.starts}


def amdahl(t1: float, parallel: float = 0.9) -> tuple[tuple[int, float], ...]:
    return tuple((m, t1 * ((1 - parallel) + parallel / m)) for m in (1, 2, 4, 8))


def test_an_idle_replica_runs_the_job_without_a_restore() -> None:
    gpus = pool(range(8), residents=(resident("a", (5,)),), services=(svc("a", 3.0),))
    assert starts(0.0, [job("j", "a")], gpus) == {"j": (5,)}


@pytest.mark.parametrize(
    ("replica_free_in", "restore", "expected"),
    [
        (0.5, 5.0, {}),  # cache affinity: waiting 0.5 s beats a 5 s restore
        (10.0, 2.0, {"j": (1,)}),  # replica scaling: restoring elsewhere finishes sooner
        (3.0, 3.0, {}),  # a tie keeps the resident (no restore)
    ],
)
def test_a_busy_replica_is_waited_for_only_while_that_is_sooner(
    replica_free_in: float, restore: float, expected: dict[str, tuple[int, ...]]
) -> None:
    gpus = pool(range(1, 8), residents=(resident("a", (0,)),), services=(svc("a", restore),))
    running = (busy("r", (0,), replica_free_in, "a"),)
    assert starts(0.0, [job("j", "a")], gpus, running) == expected


def test_the_papers_allocator_ignores_the_replica_and_restores() -> None:
    gpus = pool(range(1, 8), residents=(resident("a", (0,)),), services=(svc("a", 5.0),))
    snapshot = Snapshot(0.0, (job("j", "a"),), (gpus,), (busy("r", (0,), 0.5, "a"),))
    assert [s.units for s in decide(snapshot).starts] == [(1,)]


def test_a_job_behind_a_blocked_node_request_backfills_where_it_cannot_delay_it() -> None:
    """Two nodes; the head needs a whole node, free in 10 s. A later 2 s job of another
    service starts now on its idle replica; the paper's strict FCFS prefix starts nothing."""
    gpus = pool([g for g in range(16) if g not in (0, 1, 2, 3, 8)], total=16,
                residents=(resident("small", (12,)),),
                services=(svc("big", 0.0, dops=(8,)), svc("small", 1.0)))
    running = (busy("r0", (0, 1, 2, 3), 10.0), busy("r1", (8,), 10.0))
    jobs = [job("head", "big", ((8, 4.0),)), job("later", "small", ((1, 2.0),))]
    assert starts(0.0, jobs, gpus, running) == {"later": (12,)}
    snapshot = Snapshot(0.0, tuple(jobs), (gpus,), running)
    assert decide(snapshot).starts == ()


@pytest.mark.parametrize(("duration", "expected"), [(5.0, {"later": (4,)}), (20.0, {})])
def test_backfilling_only_fills_the_hole_before_the_heads_booking(
    duration: float, expected: dict[str, tuple[int, ...]]
) -> None:
    """GPUs 0-3 run until 10 s, so the 8-GPU head is booked on 0-7 from 10 s: GPUs 4-7 are a
    10 s hole. A 5 s job fits in it; a 20 s job would delay the head and waits."""
    gpus = pool(range(4, 8))
    running = (busy("r", (0, 1, 2, 3), 10.0),)
    jobs = [job("head", options=((8, 4.0),)), job("later", options=((1, duration),))]
    assert starts(0.0, jobs, gpus, running) == expected


def test_an_overdue_head_is_overtaken_on_its_gpus_by_nothing() -> None:
    gpus = pool(range(4, 8))
    running = (busy("r", (0, 1, 2, 3), 10.0),)
    jobs = [job("head", options=((8, 4.0),), at=-61.0), job("later", options=((1, 5.0),))]
    assert starts(0.0, jobs, gpus, running, max_bypass_s=60.0) == {}
    assert starts(0.0, jobs, gpus, running, max_bypass_s=120.0) == {"later": (4,)}


@pytest.mark.parametrize(("behind", "most"), [(0, 8), (20, 2)])
def test_the_backlog_term_takes_fewer_gpus_when_jobs_wait_behind(behind: int, most: int) -> None:
    """Alone, an elastic job takes the fastest option (8 GPUs); with 20 jobs queued behind,
    each GPU-second delays them, so it takes at most 2."""
    jobs = [job("head", options=amdahl(8.0))]
    jobs += [job(f"q{i}", options=((8, 9.0),), at=1.0 + i) for i in range(behind)]
    got = starts(2.0, jobs, pool(range(8)))
    assert len(got["head"]) == most
    no_term = starts(2.0, jobs, pool(range(8)), backlog_weight=0.0)
    assert len(no_term["head"]) == 8


def test_a_restore_unloads_a_service_nobody_waits_for_before_one_a_later_job_needs() -> None:
    """Memory fits one service per GPU. Restoring c must unload a or b; a is the least
    recently used, but a job behind asks for a, so b goes."""
    residents = (resident("a", (0,), 8 * GB, used=1), resident("b", (1,), 8 * GB, used=2))
    services = (svc("a", 4.0, 8 * GB), svc("b", 4.0, 8 * GB), svc("c", 1.0, 8 * GB))
    gpus = pool(range(2), total=2, node=2, residents=residents, services=services,
                memory=10 * GB)
    assert starts(0.0, [job("c1", "c")], gpus) == {"c1": (0,)}
    assert starts(0.0, [job("c1", "c"), job("a1", "a", at=1.0)], gpus) == {"c1": (1,),
                                                                          "a1": (0,)}


def test_no_plan_unloads_a_replica_an_earlier_job_is_booked_on() -> None:
    """a's replica on GPU 0 frees in 1 s and j1 is booked on it. j2 needs both GPUs and,
    with a resident, does not fit: its restore may not unload a, so it gets no booking, and
    j3 (a again) queues behind j1 on the same replica."""
    residents = (resident("a", (0,), 8 * GB),)
    services = (svc("a", 10.0, 8 * GB), svc("b", 1.0, 6 * GB, dops=(2,)))
    gpus = pool((1,), total=2, node=2, residents=residents, services=services, memory=10 * GB)
    jobs = [job("j1", "a", ((1, 1.0),)), job("j2", "b", ((2, 1.0),), at=1.0),
            job("j3", "a", ((1, 1.0),), at=2.0)]
    snapshot = Snapshot(0.0, tuple(jobs), (gpus,), (busy("r", (0,), 1.0, "a"),))
    planner = Planner(gpus, list(snapshot.waiting), list(snapshot.running), 0.0,
                      ReplicaConfig())
    assert planner.run() == ([], [])
    assert planner.bookings["j1"].chunk == (0,) and planner.bookings["j1"].start == 1.0
    assert "j2" not in planner.bookings
    assert planner.bookings["j3"].chunk == (0,) and planner.bookings["j3"].start == 2.0


def test_jobs_no_chunk_can_serve_are_unplaceable_and_the_rest_goes_on() -> None:
    gpus = pool(range(8), services=(svc("huge", 1.0, 90 * GB), svc("a", 1.0)))
    jobs = [job("wide", options=((16, 1.0),)), job("huge", "huge"), job("fine", "a", at=1.0)]
    decision = decide_replicas(Snapshot(0.0, tuple(jobs), (gpus,)))
    assert set(decision.unplaceable) == {"wide", "huge"}
    assert [s.job_id for s in decision.starts] == ["fine"]


def test_cpu_pools_are_left_to_the_papers_allocator() -> None:
    cpu = CpuPool("cpu", tuple(Core(i) for i in range(8)), 8)
    jobs = (Job("x", "cpu", ((1, 4.0), (2, 2.2), (4, 1.3)), 0.0),
            Job("y", "cpu", ((1, 1.0),), 1.0), job("g", options=((1, 1.0),)))
    snapshot = Snapshot(2.0, jobs, (cpu, pool(range(8))))
    ours = decide_replicas(snapshot)
    paper = decide(Snapshot(2.0, jobs[:2], (cpu,)))
    assert [s for s in ours.starts if s.key == "cpu"] == list(paper.starts)
    assert [s.job_id for s in ours.starts if s.key == GPU] == ["g"]


def test_aligned_chunks_never_cross_a_node() -> None:
    assert aligned_chunks(16, 8) == [tuple(range(8)), tuple(range(8, 16))]
    assert aligned_chunks(8, 2) == [(0, 1), (2, 3), (4, 5), (6, 7)]


def run_stream(max_bypass_s: float, horizon: float = 200.0) -> float:
    """A tiny event loop: a head needing all 8 GPUs; GPU 7 runs a long job until 20 s (as
    estimated), which leaves the other GPUs a hole; a short 1-GPU job arrives every 0.25 s,
    estimated at 0.5 s but really running 3 s. Returns when the head started."""
    policy = ReplicaPolicy(ReplicaConfig(max_bypass_s=max_bypass_s))
    waiting: list[Job] = [job("head", options=((8, 5.0),))]
    running = {"long": ((7,), 20.0, 20.0)}
    free = set(range(7))
    now, arrivals = 0.0, 0
    while now < horizon:
        while arrivals * 0.25 <= now:
            waiting.append(job(f"s{arrivals}", options=((1, 0.5),), at=arrivals * 0.25))
            arrivals += 1
        for job_id, (ids, _, end) in list(running.items()):
            if end <= now:
                free |= set(ids)
                del running[job_id]
        snapshot = Snapshot(now, tuple(waiting), (pool(tuple(sorted(free))),),
                            tuple(busy(j, ids, est) for j, (ids, est, _) in running.items()))
        for start in policy(snapshot).starts:
            if start.job_id == "head":
                return now
            free -= set(start.units)
            running[start.job_id] = (start.units, now + 0.5, now + 3.0)
            waiting = [w for w in waiting if w.job_id != start.job_id]
        now = round(now + 0.05, 6)
    return math.inf


def test_starvation_bound_holds_against_endless_short_jobs_with_wrong_estimates() -> None:
    """Short jobs backfill the hole before the head's booking, then overrun it. Once the head
    has waited max_bypass_s (10 s) nothing starts on its GPUs, so it starts the moment the
    long job ends; without the bound it also waits for the last overrunning short job.
    Either way a job past its estimate counts as ending any moment, so nothing backfills
    before it and the head never waits longer than the longest run after that."""
    assert run_stream(max_bypass_s=10.0) <= 20.0 + 0.05
    unbounded = run_stream(max_bypass_s=math.inf)
    assert 20.0 + 0.05 < unbounded <= 20.0 + 3.0 + 0.05


def test_each_idea_switched_off_changes_its_decision() -> None:
    """The ablation switches: without affinity a job restores rather than wait 0.5 s for its
    replica; without backfilling nothing overtakes a waiting job; without sparing, the
    restore unloads the least recently used service although a later job needs it."""
    gpus = pool(range(1, 8), residents=(resident("a", (0,)),), services=(svc("a", 5.0),))
    running = (busy("r", (0,), 0.5, "a"),)
    assert starts(0.0, [job("j", "a")], gpus, running) == {}
    assert starts(0.0, [job("j", "a")], gpus, running, affinity=False) == {"j": (1,)}

    jobs = [job("head", options=((8, 4.0),)), job("later", options=((1, 5.0),))]
    hole = (pool(range(4, 8)), (busy("r", (0, 1, 2, 3), 10.0),))
    assert starts(0.0, jobs, *hole) == {"later": (4,)}
    assert starts(0.0, jobs, *hole, backfill=False) == {}

    residents = (resident("a", (0,), 8 * GB, used=1), resident("b", (1,), 8 * GB, used=2))
    services = (svc("a", 4.0, 8 * GB), svc("b", 4.0, 8 * GB), svc("c", 1.0, 8 * GB))
    tight = pool(range(2), total=2, node=2, residents=residents, services=services,
                 memory=10 * GB)
    queue = [job("c1", "c"), job("a1", "a", at=1.0)]
    assert starts(0.0, queue, tight)["c1"] == (1,)
    assert starts(0.0, queue, tight, spare=False)["c1"] == (0,)


def curve(t1: float = 8.0, parallel: float = 0.9, total: int = 8) -> tuple[float, ...]:
    """Expected duration capped at k = 1..total GPUs, chunks of 1, 2, 4, 8 (Amdahl)."""
    sizes = [1, 2, 4, 8]
    return tuple(t1 * ((1 - parallel) + parallel / max(s for s in sizes if s <= k))
                 for k in range(1, total + 1))


@pytest.mark.parametrize(
    ("rate", "queued", "expected"),
    [
        (0.0, 0, None),  # nothing forecast: no cap
        (0.05, 0, None),  # light load: the fastest option
        (0.2, 0, 4),
        (0.5, 0, 2),
        (1.0, 0, 1),  # 1 job/s of 8 s work on 8 GPUs: the most throughput
        (0.05, 20, 2),  # light arrivals, but a backlog already waiting
    ],
)
def test_gpu_cap_follows_predicted_demand_and_the_backlog(
    rate: float, queued: int, expected: int | None
) -> None:
    demand = Demand(rate, curve())
    assert gpu_cap(demand, 8, RobustConfig(utilisation=1.0), queued) == expected


def test_the_policy_caps_an_elastic_job_once_demand_builds_up() -> None:
    """Alone, an elastic job takes all 8 GPUs; after a stream of elastic arrivals the
    forecast caps it, so it takes fewer (the rest of the pool serves the stream)."""
    alone = ReplicaPolicy()(Snapshot(0.0, (job("x", options=amdahl(8.0)),), (pool(range(8)),)))
    assert [len(s.units) for s in alone.starts] == [8]
    policy = ReplicaPolicy()
    running: tuple[RunningJob, ...] = ()
    for i in range(40):
        now = i * 0.5
        waiting = (job(f"w{i}", options=amdahl(8.0), at=now),)
        policy(Snapshot(now, waiting, (pool(()),), running))
    decision = policy(Snapshot(20.0, (job("x", options=amdahl(8.0), at=20.0),),
                               (pool(range(8)),)))
    assert [len(s.units) for s in decision.starts] == [1]
    uncapped = ReplicaPolicy(ReplicaConfig(cap=None))
    assert [len(s.units) for s in uncapped(
        Snapshot(20.0, (job("x", options=amdahl(8.0), at=20.0),), (pool(range(8)),))
    ).starts] == [8]
