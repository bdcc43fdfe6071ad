"""The MOPD workload on the real stack: emulated teachers on a real tritonserver, real GPU pool
workers, real Redis; and the pure pieces (the teachers' formulas, the layouts, the actions)."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import pytest

from tangram_bench.mopd_real import (
    RealGpuConfig,
    RealGpuRun,
    RestoreFit,
    TritonCrashed,
    Watch,
    layout,
    parallel_fractions,
    parts_table,
    pool_name,
    real_workload,
    restore_fit,
    run_real,
    scale_workload,
    scheduler_for,
    teacher_action,
)
from tangram_bench.mopd_real.config import POOL, SYSTEMS
from tangram_bench.mopd_real.run import WARMUP_S, warmup_calls
from tangram_bench.mopd_real.stack import worker_args
from tangram_bench.sim.invariants import incomplete, over_allocated, parts_mismatch
from tangram_bench.sim.record import RunResult
from tangram_bench.sim.services import replica_chunks
from tangram_bench.teachers.model import (
    chunk_size,
    execute_seconds,
    first_instance,
    restore_seconds,
)
from tangram_bench.teachers.repository import TeacherPhysics, memory_mb, write_repository
from tangram_bench.workloads import MopdParams, mopd
from tangram_bench.workloads.mopd import TEACHERS
from tangram_celery.reward.repository import load_repository
from tangram_celery.settings import Settings

SCALE = 0.1


def test_a_request_lasts_its_amdahl_time_on_the_chunk_it_was_given() -> None:
    durations = [execute_seconds(2.0, 0.9, k, SCALE) for k in (1, 2, 4, 8)]
    assert durations == sorted(durations, reverse=True) and len(set(durations)) == 4
    assert durations[0] == pytest.approx(0.2) and durations[3] == pytest.approx(0.2 * 0.2125)
    spec = real_workload(8, 1, SCALE).trajectories[0].actions[0]
    for k in spec.units:
        assert execute_seconds(spec.t1 / SCALE, spec.parallel, k, SCALE) == pytest.approx(
            spec.duration(k)), "the simulator's duration of the same call on k GPUs"
    assert [chunk_size(g) for g in ("3", "4,5", "0,1,2,3,4,5,6,7", "")] == [1, 2, 8, 1]


def test_a_restore_lasts_what_the_simulator_charges_for_that_chunk() -> None:
    config = RealGpuConfig(gpus=24, time_scale=SCALE)
    cluster = config.cluster()
    for teacher in TEACHERS:
        service = teacher.service
        for k in service.dops:
            assert restore_seconds(config.load_init_s, service.weights_gb, config.restore_gbps,
                                   k, SCALE) == pytest.approx(cluster.load_s(service, k))
    assert first_instance("math-7b__dop4__g0_0_0") and not first_instance("m_0_3")


def test_the_measured_restore_is_a_line_in_the_chunk_size() -> None:
    run = RealGpuRun("tangram", "mopd", {})
    run.restores = [(k, 0.5 + 0.3 + 0.2 * k, 0.5) for k in (1, 2, 4, 8)]
    fit = restore_fit([run, RunResult("static", "mopd", {})])
    assert (fit.fixed_s, fit.per_gpu_s, fit.samples) == (pytest.approx(0.3), pytest.approx(0.2), 4)
    assert restore_fit([]) == RestoreFit()
    run.restores = [(8, 0.1, 0.5)]
    assert restore_fit([run]) == RestoreFit(0.0, 0.0, 1), "never faster than emulated"
    config = RealGpuConfig(gpus=8, time_scale=SCALE)
    service = TEACHERS[6].service
    assert config.cluster(fit).load_s(service, 4) == pytest.approx(
        config.cluster().load_s(service, 4) + fit.extra_s(4))


def test_the_repository_declares_each_teacher_to_the_gpu_manager(tmp_path: Path) -> None:
    services = [t.service for t in TEACHERS]
    parallel = {t.service.name: t.parallel for t in TEACHERS}
    specs = load_repository(write_repository(tmp_path, services, parallel, TeacherPhysics()))
    assert sorted(specs) == sorted(s.name for s in services)
    for service in services:
        spec = specs[service.name]
        assert spec.dops == service.dops and spec.memory_mb == memory_mb(service)
        assert spec.memory_mb == service.memory_mb(service.dops[0])
        assert "file:1/model.py" in spec.files
        assert [t.name for t in spec.inputs] == ["t1"]
    assert not (Path(__file__).resolve().parents[2] / "triton_models" / "math-7b").exists()


def test_systems_layouts_and_actions() -> None:
    workload = real_workload(16, 1, SCALE)
    config = RealGpuConfig(gpus=24, time_scale=SCALE)
    assert parallel_fractions(workload)["moe-235b-a22b"] == 0.8
    assert scheduler_for("tangram") == Settings.from_env({}).node.scheduler == "robust"
    assert (scheduler_for("tangram:ersa"), scheduler_for("celery")) == ("elastic", "fcfs-min")
    with pytest.raises(ValueError, match="static"):
        scheduler_for("fixed-dop-4")
    assert [(p.name, p.gpu_ids) for p in layout(workload, "tangram", config)] == [
        (POOL, tuple(range(24)))]
    static = layout(workload, "static", config)
    chunks = replica_chunks(workload, config.cluster())
    assert {p.service: p.gpu_ids for p in static} == {
        name: tuple(g for c in sorted(cs) for g in c) for name, cs in chunks.items()}
    ids = [g for p in static for g in p.gpu_ids]
    assert len(ids) == len(set(ids)) and set(ids) <= set(range(24))
    spec = next(t.actions[0] for t in workload.trajectories
                if t.actions[0].service == "dense-70b")
    pooled = teacher_action(spec, "t", "tangram", workload, SCALE, oracle=True)
    fixed = teacher_action(spec, "t", "static", workload, SCALE, oracle=True)
    assert pooled.units().allowed_units() == (4, 8) and pooled.payload["pool"] == POOL
    assert fixed.units().allowed_units() == (4,)
    assert fixed.payload["pool"] == pool_name("dense-70b") == "static-dense-70b"
    assert pooled.payload["inputs"]["t1"] == pytest.approx(spec.t1 / SCALE)
    assert pooled.t1 == spec.t1 and pooled.expected_duration(8) == pytest.approx(
        spec.duration(8))
    assert pool_name("code-1.5b") == "static-code-1_5b"


@pytest.mark.parametrize(("system", "oracle"), [("tangram", False), ("static", False),
                                                ("celery", False), ("celery:cache", False),
                                                ("fixed-dop-4:cache", False), ("tangram", True),
                                                ("static", True)])
def test_a_call_tells_its_duration_and_elasticity_only_under_the_oracle(
        system: str, oracle: bool) -> None:
    workload = real_workload(8, 1, SCALE)
    spec = workload.trajectories[0].actions[0]
    action = teacher_action(spec, "t", system, workload, SCALE, oracle=oracle)
    body = action.to_json()
    told = {key for key in ("t1", "elasticity") if body.get(key) is not None}
    elastic = len(action.units().allowed_units()) > 1
    assert told == ({"t1", "elasticity"} if oracle else {"elasticity"} if elastic else set())
    assert (action.t1 is not None) is oracle
    if not oracle and elastic:
        assert body["elasticity"] == "linear", "only that it is elastic: never its Amdahl p"
    assert action.payload["inputs"] == {"t1": pytest.approx(spec.t1 / SCALE)}, (
        "the teacher's work, not a hint to the scheduler")
    assert action.signature == spec.service
    assert (action.expected_duration(spec.units[0]) is not None) is oracle


def test_the_cache_aware_pooled_baselines_run_on_the_real_stack() -> None:
    """``celery:cache`` and ``fixed-dop-4:cache`` as the simulator runs them: one pool of every
    GPU, its worker ``--cache-aware``, every call at its minimum or at the largest of its
    counts up to 4 (the simulator's FixedDop)."""
    workload = real_workload(16, 1, SCALE)
    config = RealGpuConfig(gpus=24, time_scale=SCALE)
    assert {"celery:cache", "fixed-dop-4:cache"} <= set(SYSTEMS)
    for name in ("celery:cache", "fixed-dop-4:cache", "celery", "tangram"):
        (pool,) = layout(workload, name, config)
        aware = name.endswith(":cache")
        assert pool.cache_aware is aware and pool.gpu_ids == tuple(range(24))
        assert ("--cache-aware" in worker_args(pool, 48)) is aware, name
        if aware:
            assert scheduler_for(name) == "fcfs-min"
    for trajectory in workload.trajectories:
        spec = trajectory.actions[0]
        fixed = teacher_action(spec, "t", "fixed-dop-4:cache", workload, SCALE)
        want = max((u for u in spec.units if u <= 4), default=spec.units[0])
        assert fixed.units().allowed_units() == (want,) and fixed.payload["pool"] == POOL
        assert fixed.t1 is None and fixed.elasticity is None
        celery = teacher_action(spec, "t", "celery:cache", workload, SCALE)
        assert celery.units().allowed_units()[0] == spec.units[0] and celery.t1 is None
    assert {len(teacher_action(t.actions[0], "t", "fixed-dop-4:cache", workload, SCALE)
                .units().allowed_units()) for t in workload.trajectories} == {1}


def test_the_static_warm_up_calls_state_no_duration() -> None:
    workload = real_workload(16, 1, SCALE)
    config = RealGpuConfig(gpus=24, time_scale=SCALE)
    for pool in layout(workload, "static", config):
        calls = warmup_calls(pool, workload, SCALE, 0, 3)
        size = workload.service(pool.service).dops[0]
        assert len(calls) == 3 and len({c.id for c in calls}) == 3
        for call in calls:
            assert call.t1 is None and call.elasticity is None
            assert call.to_json().get("t1") is None
            assert call.units().allowed_units() == (size,) and call.payload["pool"] == pool.name
            work = execute_seconds(call.payload["inputs"]["t1"],
                                   parallel_fractions(workload)[pool.service], size, SCALE)
            assert work == pytest.approx(WARMUP_S), "the teacher's work holds the chunk"


@pytest.mark.parametrize(("durations", "error"), [("learned", ""), ("oracle", ""),
                                                  ("noisy:0.5", "learned or oracle"),
                                                  ("learned:node", "learned or oracle")])
def test_the_real_mopd_config_takes_learned_or_oracle(durations: str, error: str) -> None:
    if error:
        with pytest.raises(ValueError, match=error):
            RealGpuConfig(durations=durations)
    else:
        assert RealGpuConfig(durations=durations).durations == durations
    assert RealGpuConfig().durations == "learned"


def test_scaling_multiplies_every_time_and_the_llm_side_again() -> None:
    base = mopd(8, 3)
    scaled = scale_workload(base, 0.5, think_scale=0.2)
    for a, b in zip(base.trajectories, scaled.trajectories, strict=True):
        assert b.actions[0].t1 == pytest.approx(a.actions[0].t1 * 0.5)
        assert b.actions[0].think_s == pytest.approx(a.actions[0].think_s * 0.1)
        assert (b.id, b.step, b.actions[0].units) == (a.id, a.step, a.actions[0].units)


class DyingServer:
    """Stands in for a tritonserver that exits ``after_s`` seconds from now."""

    pid = None

    def __init__(self, after_s: float) -> None:
        self.dies = time.monotonic() + after_s

    def running(self) -> bool:
        return time.monotonic() < self.dies

    def log_tail(self, chars: int = 0) -> str:
        return "terminate called after throwing an instance of 'boost::interprocess::...'"


def test_a_dead_server_ends_the_wait_at_once() -> None:
    watch = Watch()
    watch.attach(DyingServer(0.2))  # type: ignore[arg-type]
    started = time.monotonic()
    with pytest.raises(TritonCrashed, match="boost"):
        asyncio.run(watch.guard(asyncio.sleep(30)))
    assert time.monotonic() - started < 5

    async def quick() -> Any:
        return 42

    watch.attach(DyingServer(60))  # type: ignore[arg-type]
    assert asyncio.run(watch.guard(quick())) == 42


def peak_gpus(run: RealGpuRun) -> int:
    """The most simulated GPUs held at one instant."""
    events = sorted(itertools.chain.from_iterable(
        ((a.start, len(a.units)), (a.end, -len(a.units))) for a in run.allocations),
        key=lambda e: (e[0], e[1]))
    held = peak = 0
    for _, change in events:
        held += change
        peak = max(peak, held)
    return peak


@pytest.mark.slow
def test_real_stack_runs_tangram_and_static_services() -> None:
    """A tiny MOPD batch (2 teachers, 8 simulated GPUs) on the real stack, on one pool
    (tangram, and the cache-aware celery:cache) and on static per-teacher pools: every call
    ok, parts add up, no GPU held twice nor more GPUs than the pool has, and loads really went
    through Triton."""
    teachers = (TEACHERS[0], TEACHERS[1])
    workload = scale_workload(mopd(4, 2, MopdParams(steps=1), teachers), SCALE)
    config = RealGpuConfig(gpus=8, time_scale=SCALE)
    runs = {name: run_real(workload, name, config, {"batch": 4, "gpus": 8}, unload_wait_s=30)
            for name in ("tangram", "static", "celery:cache")}
    for name, run in runs.items():
        assert incomplete(workload, run) == [], name
        assert parts_mismatch(run) == [], name
        assert over_allocated(run) == [], name
        assert 0 < peak_gpus(run) <= config.gpus, name
        assert all(0 <= g < config.gpus for a in run.allocations for g in a.units)
        for record in run.records:
            spec = next(t.actions[0] for t in workload.trajectories if t.id == record.trajectory)
            assert record.exec >= spec.duration(record.units) * 0.99, "slept its chunk's time"
            assert record.total >= record.exec > 0
        rows = parts_table([run])
        assert rows[2].startswith(f"| {name} |  | ") and rows[2].count("|") == 9
    pooled, static = runs["tangram"], runs["static"]
    loads = sum(r.loaded for r in pooled.records)
    assert loads > 0 and pooled.triton_loads == loads, "each restore is one Triton load"
    assert pooled.unloads_after_stop == loads, "every service loaded was unloaded again"
    replicas = sum(len(c) for c in replica_chunks(workload, config.cluster()).values())
    assert static.warmup_loads == replicas and static.triton_loads == 0
    assert not any(r.loaded for r in static.records), "every replica was loaded beforehand"
    assert static.unloads_after_stop == replicas
    assert {r.units for r in static.records} == {1}
