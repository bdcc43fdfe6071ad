"""The MOPD baselines: the paper's one-TP-k-replica-per-teacher layout and the cache-aware
pooled baselines (plain-data cases, then whole small runs)."""

from __future__ import annotations

import pytest

from tangram_bench.sim.cluster import Cluster
from tangram_bench.sim.costs import SCHEDULING_ONLY
from tangram_bench.sim.invariants import violations
from tangram_bench.sim.services import replica_chunks, tp_size
from tangram_bench.sim.systems import simulate, system
from tangram_bench.workloads import mopd

FIVE_NODES = Cluster(cpu_nodes=1, gpu_nodes=5, gpus_per_node=8)


@pytest.mark.parametrize(("dops", "tp", "size"), [
    ((1, 2, 4, 8), 4, 4),
    ((2, 4, 8), 4, 4),
    ((4, 8), 4, 4),
    ((8,), 4, 8),
    ((1, 2), 4, 2),
    ((1, 2, 4, 8), 2, 2),
])
def test_tp_size_is_tp_else_the_next_allowed_else_the_largest(
        dops: tuple[int, ...], tp: int, size: int) -> None:
    assert tp_size(dops, tp) == size


def test_paper_layout_is_one_tp4_replica_per_teacher() -> None:
    chunks = replica_chunks(mopd(8, 1), FIVE_NODES, tp=4)
    assert all(len(replicas) == 1 for replicas in chunks.values())
    sizes = {name: len(replicas[0]) for name, replicas in chunks.items()}
    assert sizes["moe-235b-a22b"] == 8
    assert {size for name, size in sizes.items() if name != "moe-235b-a22b"} == {4}
    used = [gpu for replicas in chunks.values() for chunk in replicas for gpu in chunk]
    assert len(used) == len(set(used)) == 36


def test_paper_layout_refuses_a_cluster_too_small_and_says_how_many() -> None:
    with pytest.raises(ValueError, match="needs 36 GPUs; the cluster has 24"):
        replica_chunks(mopd(8, 1), Cluster(cpu_nodes=1, gpu_nodes=3), tp=4)


def test_system_names_of_the_new_baselines() -> None:
    assert system("static-tp4").tp == 4 and not system("static-tp4").pooled
    assert system("static").tp is None
    cached = system("fixed-dop-4:cache")
    assert cached.cache_aware and cached.gpu_policy == "affinity"
    assert not system("fixed-dop-4").cache_aware and system("fixed-dop-4").gpu_policy == "ersa"
    assert system("celery:cache").cache_aware and not system("celery:cache").quota
    with pytest.raises(ValueError, match="static-tp<k>"):
        system("static-tp0")


@pytest.mark.parametrize("name", ["static-tp4", "fixed-dop-4:cache", "celery:cache"])
def test_new_baselines_complete_every_action_within_capacity(name: str) -> None:
    load = mopd(24, 1)
    result = simulate(load, name, FIVE_NODES, SCHEDULING_ONLY, seed=1)
    assert violations(load, result) == []
    assert len(result.records) == load.action_count()
    if name == "static-tp4":
        assert result.capacity["gpu"] == 36.0


@pytest.mark.parametrize("baseline", ["fixed-dop-4", "celery"])
def test_cache_awareness_cuts_restores(baseline: str) -> None:
    load = mopd(48, 2)
    oblivious = simulate(load, baseline, FIVE_NODES, SCHEDULING_ONLY, seed=2)
    aware = simulate(load, f"{baseline}:cache", FIVE_NODES, SCHEDULING_ONLY, seed=2)
    restores = [sum(r.loaded for r in run.records) for run in (oblivious, aware)]
    assert restores[1] < restores[0]
