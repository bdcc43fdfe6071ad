"""Topology operators: CPU core choice (NUMA, closeness) and GPU buddy chunks."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tangram_celery.scheduling.topology import CpuOperator, GpuOperator, free_chunks
from tangram_celery.scheduling.types import Core, CpuPool, GpuPool


def cpu(free: dict[int, list[int]], total: int = 16) -> CpuOperator:
    cores = tuple(Core(core, numa) for numa, ids in free.items() for core in ids)
    return CpuOperator(CpuPool("cpu", cores, total))


def gpu(free: list[int], total: int = 8) -> GpuOperator:
    return GpuOperator(GpuPool("gpu", tuple(free), total))


# --- CPU: which concrete cores ------------------------------------------------------------

CPU_CASES = [
    # (free cores per NUMA group, requests in placement order, expected cores per job)
    ({0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}, [("a", 4)], {"a": (0, 1, 2, 3)}),
    # one group, the run with the smallest span: 5,6,7 rather than 0,1,5
    ({0: [0, 1, 5, 6, 7]}, [("a", 3)], {"a": (5, 6, 7)}),
    # fullest fit: the group with fewer free cores that still holds the request
    ({0: [0, 1], 1: [4, 5, 6, 7]}, [("a", 2)], {"a": (0, 1)}),
    # largest request first, regardless of placement order
    ({0: [0, 1, 2], 1: [4, 5, 6, 7, 8]}, [("s", 1), ("b", 5)], {"b": (4, 5, 6, 7, 8), "s": (0,)}),
    # no group holds 6: take the largest group whole, best-fit the rest
    ({0: [0, 1, 2, 3], 1: [4, 5, 6], 2: [8, 9, 10]}, [("a", 6)], {"a": (0, 1, 2, 3, 4, 5)}),
    # singles drain the fullest group first, lowest id first
    ({0: [0, 1, 2, 3], 1: [4]}, [("x", 1), ("y", 1), ("z", 1)], {"x": (4,), "y": (0,), "z": (1,)}),
]


@pytest.mark.parametrize(("free", "requests", "expected"), CPU_CASES)
def test_cpu_assign_table(
    free: dict[int, list[int]],
    requests: list[tuple[str, int]],
    expected: dict[str, tuple[int, ...]],
) -> None:
    assert cpu(free).assign(requests) == expected


def test_cpu_assign_refuses_too_many() -> None:
    with pytest.raises(ValueError, match="not enough free cores"):
        cpu({0: [0, 1]}).assign([("a", 1), ("b", 2)])


def test_cpu_place_counts_and_capacity() -> None:
    operator = cpu({0: [0, 1, 2]}, total=4)
    assert operator.start == (3,)
    assert operator.place((3,), 3) == (0,)
    assert operator.place((3,), 4) is None
    assert operator.accepts(4) and not operator.accepts(5)
    options = ((1, 1.0), (4, 0.5), (5, 0.4))
    assert operator.usable(options) == ((1, 1.0), (4, 0.5))


@settings(deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=12),
    st.lists(st.integers(1, 4), min_size=1, max_size=5),
)
def test_cpu_assign_is_exclusive_and_exact(numas: list[int], counts: list[int]) -> None:
    operator = CpuOperator(CpuPool("cpu", tuple(Core(i, n) for i, n in enumerate(numas)), 12))
    requests = [(f"j{i}", c) for i, c in enumerate(counts)]
    if sum(counts) > len(numas):
        with pytest.raises(ValueError):
            operator.assign(requests)
        return
    result = operator.assign(requests)
    given_out = [core for cores in result.values() for core in cores]
    assert len(given_out) == len(set(given_out)) == sum(counts)
    assert set(given_out) <= set(range(len(numas)))
    assert all(len(result[job]) == count for job, count in requests)


# --- GPU: buddy chunks, best fit, alignment ------------------------------------------------

CHUNK_CASES = [
    ([0, 1, 2, 3, 4, 5, 6, 7], [(0, 8)]),
    ([0, 1, 2, 3, 5, 6, 7], [(0, 4), (5, 1), (6, 2)]),
    ([1, 2], [(1, 1), (2, 1)]),  # two free GPUs but no aligned pair
    ([], []),
]


@pytest.mark.parametrize(("free", "chunks"), CHUNK_CASES)
def test_free_chunks_table(free: list[int], chunks: list[tuple[int, int]]) -> None:
    assert free_chunks(GpuPool("gpu", tuple(free), 8)) == chunks


def test_gpu_state_and_best_fit() -> None:
    operator = gpu([0, 1, 2, 3, 5, 6, 7])
    assert operator.start == (1, 1, 1, 0)  # chunks of 1, 2, 4, 8
    assert operator.place(operator.start, 1) == (0, 1, 1, 0)  # the free single, not a split
    assert operator.place(operator.start, 2) == (1, 0, 1, 0)
    assert operator.place(operator.start, 8) is None
    assert operator.free_units(operator.start) == 7


def test_gpu_alignment_blocks_a_pair_of_loose_gpus() -> None:
    operator = gpu([1, 2])
    assert operator.free_units(operator.start) == 2
    assert operator.place(operator.start, 2) is None


def test_gpu_assign_keeps_large_chunks_whole() -> None:
    operator = gpu([0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], total=16)
    result = operator.assign([("one", 1), ("two", 2), ("eight", 8), ("four", 4)])
    assert result == {
        "one": (5,),
        "two": (6, 7),
        "eight": (8, 9, 10, 11, 12, 13, 14, 15),
        "four": (0, 1, 2, 3),
    }


def test_gpu_accepts_only_powers_of_two_within_a_node() -> None:
    operator = gpu(list(range(8)))
    assert [u for u in range(1, 17) if operator.accepts(u)] == [1, 2, 4, 8]


gpu_free = st.sets(st.integers(0, 15)).map(sorted)
gpu_requests = st.lists(st.sampled_from([1, 1, 2, 2, 4, 8]), min_size=1, max_size=5)


@settings(max_examples=300, deadline=None)
@given(gpu_free, gpu_requests)
def test_best_fit_feasibility_does_not_depend_on_order(
    free: list[int], requests: list[int]
) -> None:
    """Why the FCFS fit test and the DP (which places inelastic jobs first) agree."""
    operator = gpu(free, total=16)
    outcomes = set()
    for order in itertools.permutations(requests):
        state: tuple[int, ...] | None = operator.start
        for units in order:
            state = operator.place(state, units) if state is not None else None
        outcomes.add(state is not None)
    assert len(outcomes) == 1


@settings(max_examples=300, deadline=None)
@given(gpu_free, gpu_requests)
def test_gpu_assign_matches_the_count_state(free: list[int], requests: list[int]) -> None:
    """Concrete chunks follow the same best-fit steps as the chunk counts the DP uses."""
    operator = gpu(free, total=16)
    state: tuple[int, ...] | None = operator.start
    for units in requests:
        state = operator.place(state, units) if state is not None else None
    named = [(f"j{i}", units) for i, units in enumerate(requests)]
    if state is None:
        with pytest.raises(ValueError):
            operator.assign(named)
        return
    result = operator.assign(named)
    used = {g for ids in result.values() for g in ids}
    assert len(used) == sum(requests) and used <= set(free)
    for job, units in named:
        ids = result[job]
        assert ids == tuple(range(ids[0], ids[0] + units)) and ids[0] % units == 0
    left = GpuOperator(GpuPool("gpu", tuple(sorted(set(free) - used)), 16)).start
    assert left == state
