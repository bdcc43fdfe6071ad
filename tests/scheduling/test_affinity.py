"""Cache-aware FCFS of the pooled GPU baselines (plain data)."""

from __future__ import annotations

from tangram_celery.scheduling import GpuPool, Job, Snapshot
from tangram_celery.scheduling.affinity import AffinityPolicy, affinity_order, cache_aware_chunks
from tangram_celery.scheduling.residency import Resident, service_name
from tangram_celery.scheduling.types import Service

SERVICES = tuple(Service(s, ((1, 1000), (2, 1000)), ((1, 5.0), (2, 3.0))) for s in "abc")


def job(name: str, service: str, submitted: float, units: int = 1) -> Job:
    return Job(name, "gpu", ((units, 1.0),), submitted, elastic=False, service=service)


def pool(free: tuple[int, ...], residents: tuple[tuple[str, tuple[int, ...]], ...]) -> GpuPool:
    placed = tuple(Resident(service_name(m, c), m, c, 1000, i)
                   for i, (m, c) in enumerate(residents))
    return GpuPool("gpu", free, 8, 8, placed, SERVICES, 80_000)


def ids(jobs: tuple[Job, ...]) -> list[str]:
    return [j.job_id for j in jobs]


def test_hits_go_first_then_fcfs() -> None:
    gpus = pool((0, 1, 2, 3), (("b", (2,)),))
    ordered = (job("j1", "a", 0.0), job("j2", "b", 1.0), job("j3", "c", 2.0))
    assert ids(affinity_order(ordered, {"gpu": gpus}, 3.0)) == ["j2", "j1", "j3"]


def test_a_miss_waits_for_its_busy_replica_up_to_its_restore_time() -> None:
    gpus = pool((0, 1, 2, 3), (("a", (5,)),))
    early = (job("j1", "a", 0.0), job("j2", "c", 1.0))
    assert ids(affinity_order(early, {"gpu": gpus}, 4.9)) == ["j2"]
    assert ids(affinity_order(early, {"gpu": gpus}, 5.0)) == ["j1", "j2"]


def test_a_replica_of_another_size_is_no_hit() -> None:
    gpus = pool((0, 1, 2, 3), (("a", (0, 1)),))
    assert ids(affinity_order((job("j1", "a", 0.0),), {"gpu": gpus}, 0.0)) == ["j1"]


def test_policy_starts_the_hit_and_holds_the_waiting_miss() -> None:
    gpus = pool((0, 1), (("b", (1,)), ("a", (4,))))
    waiting = (job("j1", "a", 0.0), job("j2", "b", 0.5))
    decision = AffinityPolicy()(Snapshot(1.0, waiting, (gpus,)))
    assert [s.job_id for s in decision.starts] == ["j2"]


def _resident(model: str, chunk: tuple[int, ...], used: int) -> tuple[str, Resident]:
    name = service_name(model, chunk)
    return name, Resident(name, model, chunk, 1000, used)


def test_cache_aware_chunks_move_a_start_onto_its_resident_replica() -> None:
    residents = dict([_resident("a", (4, 5), 1), _resident("a", (6, 7), 3)])
    chunks = cache_aware_chunks([("a", (0, 1))], range(8), 8, 8, residents)
    assert chunks == [(6, 7)]


def test_cache_aware_chunks_keep_the_policys_chunk_without_a_resident() -> None:
    residents = dict([_resident("b", (4, 5), 1)])
    assert cache_aware_chunks([("a", (2, 3))], range(8), 8, 8, residents) == [(2, 3)]


def test_cache_aware_chunks_place_largest_first_so_everything_still_fits() -> None:
    residents = dict([_resident("a", (0,), 1)])
    requests = [("a", (1,)), ("b", (2, 3)), ("c", (4, 5, 6, 7))]
    chunks = cache_aware_chunks(requests, range(8), 8, 8, residents)
    assert chunks[2] == (4, 5, 6, 7)
    assert chunks[0] == (0,)
    used = [gpu for chunk in chunks for gpu in chunk]
    assert len(used) == len(set(used)) == 7
    assert all(len(c) == len(r[1]) for c, r in zip(chunks, requests, strict=True))
