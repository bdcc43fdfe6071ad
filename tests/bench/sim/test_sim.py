"""The discrete-event simulator: invariants, determinism, the systems' defining behaviour."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tangram_bench.sim.cluster import Cluster
from tangram_bench.sim.costs import CONTROL_PLANE, PRESETS, SCHEDULING_ONLY, Costs, charged
from tangram_bench.sim.engine import Engine
from tangram_bench.sim.invariants import violations
from tangram_bench.sim.pods import TokenBucket, water_fill
from tangram_bench.sim.policy import (
    DEFAULT_POLICY,
    POLICIES,
    policy_factory,
    register_policy,
)
from tangram_bench.sim.quota import Provider
from tangram_bench.sim.record import RunResult
from tangram_bench.sim.services import replica_counts
from tangram_bench.sim.systems import backends, simulate, system
from tangram_bench.workloads import ApiLimit, Workload, coding, deepsearch, mopd
from tangram_bench.workloads.deepsearch import DeepSearchParams
from tangram_celery.scheduling import Decision, Snapshot
from tangram_celery.scheduling.ordering import DEFAULT_BYPASS_S

SYSTEMS = ["tangram", "static", "static-n4", "fixed-dop-4", "fixed-dop-16", "celery"]
SMALL_CPU = Cluster(cpu_nodes=2, cores_per_node=32, numa_per_node=2)
SMALL_GPU = Cluster(cpu_nodes=1, gpu_nodes=3, gpus_per_node=8)


def small(name: str, seed: int = 1) -> tuple[Workload, Cluster]:
    if name == "coding":
        return coding(24, seed), SMALL_CPU
    if name == "mopd":
        return mopd(24, seed), SMALL_GPU
    return deepsearch(24, seed), SMALL_GPU


@pytest.mark.parametrize("costs", [SCHEDULING_ONLY, CONTROL_PLANE], ids=["sched", "cp"])
@pytest.mark.parametrize("workload", ["coding", "mopd", "deepsearch"])
@pytest.mark.parametrize("name", SYSTEMS)
def test_every_action_completes_parts_add_up_no_unit_over_allocated(
    name: str, workload: str, costs: Costs
) -> None:
    load, cluster = small(workload)
    result = simulate(load, name, cluster, costs, seed=1)
    assert violations(load, result) == []
    assert len(result.records) == load.action_count()
    assert len(result.step_times) == load.steps
    assert result.makespan > 0 and result.reserved > 0


@pytest.mark.parametrize("workload", ["coding", "mopd", "deepsearch"])
@pytest.mark.parametrize("name", ["tangram", "static", "celery"])
def test_same_seed_same_result(name: str, workload: str) -> None:
    load, cluster = small(workload)
    first = simulate(load, name, cluster, CONTROL_PLANE, seed=4)
    second = simulate(small(workload)[0], name, cluster, CONTROL_PLANE, seed=4)
    assert first.timeline() == second.timeline()
    other = simulate(small(workload, seed=2)[0], name, cluster, CONTROL_PLANE, seed=4)
    assert other.timeline() != first.timeline()


def test_shapes_decide_the_units() -> None:
    load, cluster = small("coding")
    tests = {name: [r.units for r in simulate(load, name, cluster, SCHEDULING_ONLY).records
                    if r.kind == "test_run"] for name in ("fixed-dop-4", "celery", "tangram")}
    assert set(tests["fixed-dop-4"]) == {4}
    assert set(tests["celery"]) == {1}
    assert max(tests["tangram"]) > 4


def test_a_registered_policy_drops_in() -> None:
    calls: list[int] = []

    def spy() -> object:
        inner = policy_factory(DEFAULT_POLICY)()

        def policy(snapshot: Snapshot) -> Decision:
            calls.append(len(snapshot.waiting))
            return inner(snapshot)

        policy.lend = inner.lend  # type: ignore[attr-defined]
        return policy

    register_policy("spy", spy)  # type: ignore[arg-type]
    try:
        load, cluster = small("coding")
        via_spy = simulate(load, "tangram:spy", cluster, SCHEDULING_ONLY)
        default = simulate(load, "tangram", cluster, SCHEDULING_ONLY)
        assert calls and via_spy.timeline() == default.timeline()
        assert simulate(load, "tangram", cluster, SCHEDULING_ONLY,
                        default_policy="spy").timeline() == default.timeline()
    finally:
        del POLICIES["spy"]
    with pytest.raises(ValueError, match="unknown policy"):
        system("tangram:nope")


def test_static_control_plane_costs_are_charged() -> None:
    load, cluster = small("coding")
    alone = simulate(load, "static", cluster, SCHEDULING_ONLY)
    costs = Costs(pod_start_s=3.0, exec_latency_s=0.1, max_pods_per_node=4)
    charged = simulate(load, "static", cluster, costs)
    assert all(r.overhead == 0 for r in alone.records)
    firsts = [r for r in charged.records if r.index == 0]
    assert all(r.overhead >= 0.1 - 1e-9 for r in charged.records)
    assert max(r.queue for r in firsts) > 0  # 24 trajectories, 8 pod slots: some wait
    assert violations(load, charged) == []


def test_the_api_token_bucket_sends_a_burst_then_one_request_per_token() -> None:
    bucket = TokenBucket(rate=2.0, burst=3)
    sent = [bucket.take(0.0) for _ in range(5)]
    assert sent == [0.0, 0.0, 0.0, pytest.approx(0.5), pytest.approx(1.0)]
    assert bucket.take(10.0) == 10.0
    with pytest.raises(ValueError, match="qps > 0"):
        TokenBucket(rate=0.0, burst=1)


def test_a_system_is_charged_only_the_costs_it_pays() -> None:
    assert charged(CONTROL_PLANE, pooled=True) == Costs(dispatch_s=CONTROL_PLANE.dispatch_s)
    assert charged(CONTROL_PLANE, pooled=False).dispatch_s == 0.0
    assert charged(PRESETS["pods110"], pooled=True) == SCHEDULING_ONLY
    assert charged(PRESETS["pods110"], pooled=False).max_pods_per_node == 110


def test_static_pod_creations_wait_for_the_api_rate_limit() -> None:
    load, cluster = small("coding")
    alone = simulate(load, "static", cluster, SCHEDULING_ONLY)
    limited = simulate(load, "static", cluster, Costs(api_qps=1.0, api_burst=4))
    starts = sorted(r.started for r in limited.records if r.index == 0)
    assert all(r.queue == 0 for r in alone.records if r.index == 0)
    assert max(r.queue for r in limited.records if r.index == 0) > 0
    assert all(at >= i - 3 - 1e-9 for i, at in enumerate(starts))  # 4 at once, then 1/s
    assert max(r.started for r in alone.records if r.index == 0) < starts[-1]
    assert violations(load, limited) == []


def test_water_fill_is_max_min_fair_and_work_conserving() -> None:
    demand = np.array([0.5, 4.0, 4.0, 1.0, 2.5])
    shares = water_fill(demand, 6.0)
    assert shares.sum() == pytest.approx(6.0)
    assert shares[0] == 0.5 and shares[3] == 1.0
    assert shares[1] == pytest.approx(shares[2]) == pytest.approx(shares[4])
    assert list(water_fill(demand, 100.0)) == list(demand)


def test_static_services_fit_the_gpus_in_proportion_to_demand() -> None:
    load = mopd(64, 1)
    counts = replica_counts(load, 40)
    sizes = {s.name: s.dops[0] for s in load.services}
    assert sum(counts[n] * sizes[n] for n in counts) <= 40
    assert all(c >= 1 for c in counts.values())
    with pytest.raises(ValueError, match="cannot host"):
        replica_counts(load, 8)


def test_provider_quota() -> None:
    provider = Provider(ApiLimit("x", concurrency=2, qps=1.0))
    assert provider.accepts(0.0)
    provider.take(0.0)
    assert not provider.accepts(0.5)
    assert provider.token_at(0.5) == pytest.approx(1.0)
    provider.take(1.0)
    assert not provider.accepts(5.0)  # two in flight
    provider.done()
    assert provider.accepts(5.0)


def test_pooled_api_calls_never_exceed_the_quota_rate() -> None:
    load, cluster = small("deepsearch")
    result = simulate(load, "tangram", cluster, SCHEDULING_ONLY)
    limit = load.apis[0]
    starts = sorted(r.started for r in result.records if r.kind == "api")
    window = 1.0
    for i, start in enumerate(starts):
        inside = sum(1 for s in starts[i:] if s < start + window)
        assert inside <= limit.qps * window + max(1.0, limit.qps) + 1e-9
    assert all(r.queue >= 0 for r in result.records)


def _api_calls(result: RunResult) -> list[tuple[float, float, str]]:
    """(arrival at the manager, start, trajectory) of every API call."""
    return [(r.submitted + r.overhead, r.started, r.trajectory) for r in result.records
            if r.kind == "api"]


@pytest.mark.parametrize("bypass", [0.0, 2.0, DEFAULT_BYPASS_S])
def test_pooled_api_order_is_oldest_trajectory_first_within_the_bypass_bound(
        bypass: float) -> None:
    load = deepsearch(48, 1, DeepSearchParams(api_concurrency=4, api_qps=4.0))
    chosen = replace(system("tangram"), api_bypass_s=bypass)
    result = RunResult("tangram", load.name, {})
    Engine(load, backends(load, chosen, SMALL_GPU, SCHEDULING_ONLY, 1), None).run(result)
    assert violations(load, result) == []
    calls = _api_calls(result)
    overtaken = 0
    for arrived_a, started_a, _ in calls:
        for arrived_b, started_b, _ in calls:
            if arrived_b > arrived_a and started_b < started_a:
                overtaken += 1
                assert arrived_b <= arrived_a + bypass + 1e-9, "overtaken past the bound"
    assert (overtaken == 0) == (bypass == 0.0), "bypass 0 is FCFS, otherwise the order acts"


def test_the_api_order_ablation_and_the_papers_allocator_are_fcfs() -> None:
    assert system("tangram").api_bypass_s == DEFAULT_BYPASS_S
    for name in ("tangram:api-fcfs", "tangram:ersa", "fixed-dop-4"):
        assert system(name).api_bypass_s == 0.0, name
