"""The GPU manager's pure policy: placement with LRU eviction, chunk ranking, chunk checks."""

from __future__ import annotations

import pytest

from tangram_celery.errors import ValidationError
from tangram_celery.managers.gpu import (
    Placement,
    Resident,
    check_chunk,
    instance_group,
    memory_used,
    placement_parameters,
    plan_placement,
    rank_chunks,
    service_name,
)


def residents(*items: tuple[str, tuple[int, ...], int, int]) -> dict[str, Resident]:
    """(model, chunk, memory_mb, last_used) -> residents by service name."""
    out = {}
    for model, chunk, memory, used in items:
        name = service_name(model, chunk)
        out[name] = Resident(name, model, chunk, memory, used)
    return out


def test_service_name_encodes_model_parallelism_and_first_gpu() -> None:
    assert service_name("rm", (4, 5)) == "rm__dop2__g4"
    assert service_name("rm", (4,)) == "rm__dop1__g4"
    assert service_name("rm", (0, 1, 2, 3)) == "rm__dop4__g0"


def test_resident_service_runs_now() -> None:
    state = residents(("rm", (0,), 100, 1))
    assert plan_placement(state, "rm", (0,), 100, 100) == Placement("rm__dop1__g0", False, ())


def test_free_room_loads_without_eviction() -> None:
    state = residents(("a", (0,), 50, 1))
    assert plan_placement(state, "b", (0,), 50, 100) == Placement("b__dop1__g0", True, ())


def test_least_recently_used_overlapping_resident_is_evicted_first() -> None:
    state = residents(("a", (0,), 50, 3), ("b", (0,), 50, 1), ("c", (1,), 50, 0))
    plan = plan_placement(state, "d", (0,), 50, 100)
    assert plan.evict == ("b__dop1__g0",)
    assert plan.load and plan.fits


def test_eviction_continues_until_every_gpu_of_the_chunk_has_room() -> None:
    state = residents(("a", (0,), 60, 1), ("b", (1,), 60, 2), ("c", (2,), 60, 0))
    plan = plan_placement(state, "d", (0, 1), 60, 100)
    assert plan.evict == ("a__dop1__g0", "b__dop1__g1")  # never "c": it does not overlap


def test_a_resident_not_blocking_any_short_gpu_is_kept() -> None:
    # GPU 1 has room already; the LRU resident only on GPU 1 stays.
    state = residents(("a", (1,), 10, 0), ("b", (0,), 90, 1))
    plan = plan_placement(state, "d", (0, 1), 50, 100)
    assert plan.evict == ("b__dop1__g0",)


def test_pinned_residents_are_never_evicted() -> None:
    state = residents(("a", (0,), 100, 0))
    plan = plan_placement(state, "b", (0,), 50, 100, pinned=frozenset({"a__dop1__g0"}))
    assert plan.evict == () and not plan.fits


def test_a_model_larger_than_a_gpu_does_not_fit() -> None:
    assert not plan_placement({}, "huge", (0,), 200, 100).fits


def test_memory_used_counts_each_gpu_of_a_chunk() -> None:
    state = residents(("a", (0, 1), 30, 0), ("b", (1,), 20, 0))
    assert memory_used(state.values()) == {0: 30, 1: 50}


def test_rank_prefers_idle_then_resident_then_fewest_evictions() -> None:
    state = residents(("rm", (2,), 50, 5), ("x", (1,), 100, 1), ("rm", (3,), 50, 6))
    chunks = [(0,), (1,), (2,), (3,)]
    ranked = rank_chunks(state, "rm", chunks, 50, 100, busy=frozenset({3}))
    assert ranked == [(2,), (0,), (1,), (3,)]


@pytest.mark.parametrize(
    ("gpus", "reason"),
    [
        ([], "non-empty"),
        ("0", "non-empty"),
        ([0, True], "integers"),
        ([9], "not in this pool"),
        ([0, 0], "repeat"),
        ([0, 1, 2], "allows"),
        ([1, 2], "aligned"),
        ([0, 2], "aligned"),
    ],
)
def test_bad_chunks_name_the_gpus_field(gpus: object, reason: str) -> None:
    with pytest.raises(ValidationError) as info:
        check_chunk(gpus, list(range(8)), (1, 2, 4, 8))
    assert info.value.field == "gpus"
    assert reason in info.value.reason


def test_good_chunks_are_returned_in_pool_order() -> None:
    assert check_chunk([3, 2], [0, 1, 2, 3], (1, 2)) == (2, 3)
    assert check_chunk((6, 7, 4, 5), [4, 5, 6, 7], (4,)) == (4, 5, 6, 7)


def test_instance_group_says_kind_gpu_on_real_gpus() -> None:
    assert instance_group((4, 5), simulated=False) == [
        {"kind": "KIND_GPU", "count": 1, "gpus": [4, 5]}
    ]


def test_simulated_gpus_become_one_cpu_instance_each() -> None:
    assert instance_group((4, 5), simulated=True) == [{"kind": "KIND_CPU", "count": 2}]
    assert placement_parameters((4, 5), True) == {
        "tangram_gpus": "4,5",
        "tangram_simulated": "true",
    }
