"""Plain-data tables for the pure pool-sizing policy."""

from __future__ import annotations

import math

import pytest

from tangram_celery.autoscale.policy import (
    DOWN,
    HOLD,
    UP,
    Budget,
    PoolLimits,
    PoolLoad,
    ScalingConfig,
    decide,
)

CONFIG = ScalingConfig(target_wait_s=2.0, down_hold_s=20.0, low_water=0.6, queue_slo_s=5.0,
                       fallback_duration_s=1.0)
LIMITS = {"cpu": PoolLimits(1, 8), "gpu/a": PoolLimits(0, 4), "gpu/b": PoolLimits(0, 4)}


def cpu(**fields: object) -> PoolLoad:
    """A CPU pool of 2-core nodes with some fields changed."""
    base: dict[str, object] = {"pool": "cpu", "resource": "cpu", "member_units": 2, "size": 1}
    return PoolLoad(**{**base, **fields})  # type: ignore[arg-type]


def gpu(name: str, **fields: object) -> PoolLoad:
    """A GPU pool of 1-GPU members."""
    base: dict[str, object] = {"pool": name, "resource": "gpu", "member_units": 1, "size": 1}
    return PoolLoad(**{**base, **fields})  # type: ignore[arg-type]


# (case, load, cpu budget, expected target, expected action, reason starts with)
SINGLE = [
    ("idle at minimum", cpu(size=1), 16, 1, HOLD, "steady"),
    ("burst of long test runs", cpu(size=1, ready=12, predicted_work_s=24.0), 16, 6, UP, "grow"),
    ("many tiny actions do not grow", cpu(size=1, ready=40, predicted_work_s=0.04), 16, 1, HOLD,
     "steady"),
    ("prefetched work counts", cpu(size=1, prefetched=8, predicted_work_s=8.0), 16, 2, UP,
     "grow"),
    ("unknown durations use recent exec", cpu(size=1, ready=4, unknown=4, recent_exec_s=3.0),
     16, 3, UP, "grow"),
    ("growth capped by pool maximum", cpu(size=2, ready=99, predicted_work_s=400.0), 64, 8, UP,
     "grow"),
    ("budget exhausted", cpu(size=2, ready=99, predicted_work_s=400.0), 6, 3, UP, "grow"),
    ("drain: idle but inside hold time", cpu(size=6, since_scale_s=5.0), 16, 6, HOLD, "hold"),
    ("drain: idle after hold time", cpu(size=6, since_scale_s=30.0), 16, 1, DOWN, "shrink"),
    ("drain: keeps room for running units", cpu(size=6, running_units=3, since_scale_s=30.0),
     16, 3, DOWN, "shrink"),
    ("hysteresis band keeps size", cpu(size=4, running_units=5, since_scale_s=99.0), 16, 4,
     HOLD, "steady"),
    ("late queueing adds a member", cpu(size=2, ready=2, predicted_work_s=0.1,
                                        recent_queue_s=9.0), 16, 3, UP, "grow: recent"),
    ("minimum enforced", cpu(size=0), 16, 1, UP, "grow"),
    ("trajectories waiting for memory grow the pool",
     cpu(size=1, memory_mb=24 * 512, memory_waiting=8, member_memory_mb=8192), 16, 2, UP,
     "grow: 8 trajectories wait for memory"),
    ("memory waits grow within the budget",
     cpu(size=1, memory_mb=64 * 512, memory_waiting=48, member_memory_mb=8192), 6, 3, UP,
     "grow: 48 trajectories wait"),
    ("held memory keeps members through a drain",
     cpu(size=3, memory_mb=10000, member_memory_mb=8192, since_scale_s=99.0), 16, 2, DOWN,
     "shrink"),
    ("memory not counted without a member size", cpu(size=1, memory_mb=1e6, memory_waiting=9),
     16, 1, HOLD, "steady"),
]


@pytest.mark.parametrize(("case", "load", "cores", "target", "action", "reason"), SINGLE,
                         ids=[row[0] for row in SINGLE])
def test_single_pool(case: str, load: PoolLoad, cores: int, target: int, action: str,
                     reason: str) -> None:
    decision = decide([load], Budget({"cpu": cores}, LIMITS), CONFIG)
    (got,) = decision.targets
    assert (got.target, got.action) == (target, action), got.describe()
    assert got.reason.startswith(reason), got.describe()


def test_budget_shared_between_competing_pools() -> None:
    """Two GPU pools want 4 GPUs each with 4 in the budget: the busier gets more, both grow."""
    busy = gpu("gpu/a", ready=30, predicted_work_s=30.0)
    light = gpu("gpu/b", ready=10, predicted_work_s=10.0)
    decision = decide([busy, light], Budget({"gpu": 4}, LIMITS), CONFIG)
    a, b = decision.target("gpu/a"), decision.target("gpu/b")
    assert a is not None and b is not None
    assert a.target + b.target == 4
    assert a.target > b.target >= 1
    assert "budget allows" in a.reason


def test_capacity_moves_to_the_pool_with_demand() -> None:
    """An idle pool gives its members to a busy pool when the budget binds."""
    idle = gpu("gpu/a", size=3, since_scale_s=1.0)
    busy = gpu("gpu/b", size=1, ready=20, predicted_work_s=20.0)
    decision = decide([idle, busy], Budget({"gpu": 4}, LIMITS), CONFIG)
    assert [(t.pool, t.target) for t in decision.targets] == [("gpu/a", 0), ("gpu/b", 4)]


def test_running_floor_beats_the_budget() -> None:
    """Members that running actions hold are never taken away, even over budget."""
    held = gpu("gpu/a", size=3, running_units=3, running=3, since_scale_s=99.0)
    busy = gpu("gpu/b", size=1, ready=20, predicted_work_s=20.0)
    decision = decide([held, busy], Budget({"gpu": 3}, LIMITS), CONFIG)
    assert [(t.pool, t.target) for t in decision.targets] == [("gpu/a", 3), ("gpu/b", 0)]


def test_burst_then_drain_sequence() -> None:
    """A burst grows the pool at once; the drain waits for the hold time, then shrinks."""
    budget = Budget({"cpu": 16}, LIMITS)
    steps = [
        (cpu(size=1, ready=20, predicted_work_s=20.0, since_scale_s=math.inf), 5),
        (cpu(size=5, running_units=10, ready=4, predicted_work_s=4.0, since_scale_s=1.0), 6),
        (cpu(size=6, running_units=2, since_scale_s=3.0), 6),
        (cpu(size=6, since_scale_s=25.0), 1),
    ]
    sizes = [decide([load], budget, CONFIG).targets[0].target for load, _ in steps]
    assert sizes == [want for _, want in steps]


def test_decision_is_data_and_describes_itself() -> None:
    decision = decide([cpu(size=1, ready=6, predicted_work_s=6.0)], Budget({}, LIMITS), CONFIG)
    assert decision.changes()[0].describe().startswith("cpu: 1 -> 2 (up;")


def test_min_growth_multiplies_the_step() -> None:
    load = cpu(size=2, ready=6, predicted_work_s=10.0)
    config = ScalingConfig(min_growth=2.0)
    assert decide([load], Budget({}, LIMITS), CONFIG).targets[0].target == 3
    assert decide([load], Budget({}, LIMITS), config).targets[0].target == 4


@pytest.mark.parametrize("kwargs", [{"min_growth": 0.5}, {"target_wait_s": 0},
                                    {"low_water": 0}, {"low_water": 1.5}, {"down_hold_s": -1}])
def test_config_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ScalingConfig(**kwargs)
