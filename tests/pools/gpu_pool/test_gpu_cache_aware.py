"""A GPU pool worker run ``--cache-aware``: the pooled baselines' cache-aware FCFS on the real
gate (plain-data policy cases, then the runtime with the repository's real specs and a
stand-in executor: no GPU here)."""

from __future__ import annotations

import time

from test_gpu_pool import FakeExecutor, message

from tangram_celery.action import ActionResult
from tangram_celery.managers.gpu import Resident
from tangram_celery.pools.admission import Grant, PoolState, Request, Running
from tangram_celery.pools.gpu_pool import GpuPoolRuntime
from tangram_celery.pools.gpu_pool.policy import gate_policy, with_restore_prior
from tangram_celery.pools.placement import Residency
from tangram_celery.scheduling.residency import service_name
from tangram_celery.scheduling.types import Service
from tangram_celery.settings import Settings

SERVICES = (Service("a", ((1, 1000), (2, 1000))), Service("b", ((1, 1000),), ((1, 3.0),)))


def residency(*placed: tuple[str, tuple[int, ...]]) -> Residency:
    residents = tuple(Resident(service_name(m, c), m, c, 1000, i)
                      for i, (m, c) in enumerate(placed))
    return Residency(residents, SERVICES, 80_000)


def decide(held: Residency, waiting: tuple[Request, ...], free: tuple[int, ...],
           running: tuple[Running, ...] = (), now: float = 10.0) -> list[Grant]:
    settings = Settings.from_env({}, scheduler="fcfs-min", gpu_restore_s=5.0)
    policy = gate_policy(settings, "p", 8, lambda: held, lambda _, c: c[0], cache_aware=True)
    return [(a, tuple(u)) for a, u in policy(PoolState(waiting, free, running, 8, now))]


def call(action_id: str, service: str, arrived: float, units: int = 1) -> Request:
    return Request(action_id, ((units, None),), arrived, service=service)


def test_unmeasured_restores_take_the_prior() -> None:
    view = with_restore_prior(lambda: residency(), 5.0)()
    assert [s.restore_s for s in view.services] == [((1, 5.0), (2, 5.0)), ((1, 3.0),)]


def test_a_hit_goes_first_onto_its_replica() -> None:
    held = residency(("b", (6,)))
    grants = decide(held, (call("x", "a", 0.0), call("y", "b", 1.0)), tuple(range(8)))
    assert ("y", (6,)) in grants and len(grants) == 2


def test_a_miss_waits_for_its_busy_replica_at_most_its_restore_time() -> None:
    held = residency(("b", (0,)))
    busy = (Running("r", (0,), 0.0, None, "b"),)
    free = tuple(range(1, 8))
    assert decide(held, (call("y", "b", 9.0),), free, busy, now=10.0) == []
    assert len(decide(held, (call("y", "b", 9.0),), free, busy, now=12.5)) == 1


def test_the_runtime_runs_a_call_where_its_service_is_resident() -> None:
    """The backend ranks the highest id first; the cache-aware gate takes the replica."""
    executor = FakeExecutor()
    executor.residents_loaded = [
        Resident("unit__answer_match__dop1__g13", "answer_match", (13,), 64, 1)]
    runtime = GpuPoolRuntime(Settings.from_env({}, scheduler="fcfs-min"), "unit", executor,
                             range(10, 18), 8, name="w1", cache_aware=True)
    result = ActionResult.from_json(runtime.execute(message(), time.time()))
    assert result.status == "ok" and result.units == (13,)
