"""RobustConfig.floor: an elastic job never starts below it (an idea measured for issue 20;
its default, 1, keeps the robust scheduler as it was)."""

from __future__ import annotations

import pytest

from tangram_celery.scheduling import Core, CpuPool, Job, RobustConfig, RunningJob, Snapshot
from tangram_celery.scheduling.robust import decide_robust

CORES = 8


def snapshot(free: int) -> Snapshot:
    options = tuple((m, 20.0 * (0.1 + 0.9 / m)) for m in range(1, CORES + 1))
    busy = tuple(RunningJob(f"exec-{i}", "node", 1, 0.3) for i in range(CORES - free))
    pool = CpuPool("node", tuple(Core(i) for i in range(free)), CORES)
    return Snapshot(0.0, (Job("test", "node", options, 0.0),), (pool,), busy)


@pytest.mark.parametrize("free", [1, 2, 3, 8])
def test_an_elastic_job_starts_on_at_least_the_floor(free: int) -> None:
    decision = decide_robust(snapshot(free), config=RobustConfig(floor=3))
    assert all(start.count >= 3 for start in decision.starts)
    if free == CORES:
        assert [start.job_id for start in decision.starts] == ["test"]


def test_the_floor_must_be_a_unit() -> None:
    with pytest.raises(ValueError, match="floor"):
        RobustConfig(floor=0)
