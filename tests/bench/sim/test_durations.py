"""What the pooled systems' policies are told: learned (default), oracle, noisy."""

from __future__ import annotations

import pytest

from tangram_bench.sim.cluster import Cluster
from tangram_bench.sim.costs import SCHEDULING_ONLY
from tangram_bench.sim.durations import (
    DurationMode,
    Durations,
    ablation,
    parse_durations,
    signature,
)
from tangram_bench.sim.engine import Engine
from tangram_bench.sim.gpupool import GpuPooled
from tangram_bench.sim.invariants import violations
from tangram_bench.sim.record import RunResult
from tangram_bench.sim.systems import backends, simulate, system
from tangram_bench.workloads import ActionSpec, Trajectory, Workload, coding, mopd

SPEC = ActionSpec("test_run", 8.0, 0.0, (1, 2, 4), 1.0, signature="p0")
EXACT = ((1, 8.0), (2, 4.0), (4, 2.0))


@pytest.mark.parametrize(("text", "mode"), [("learned", DurationMode("learned")),
                                            ("learned:node", DurationMode("learned",
                                                                          per_node=True)),
                                            ("oracle", DurationMode("oracle")),
                                            ("noisy:0.7", DurationMode("noisy", 0.7))])
def test_parse(text: str, mode: DurationMode) -> None:
    assert parse_durations(text) == mode and mode.label == text


@pytest.mark.parametrize("text", ["exact", "noisy", "noisy:-1", "noisy:x", "oracle:1",
                                  "learned:pod"])
def test_parse_names_the_accepted_values(text: str) -> None:
    with pytest.raises(ValueError, match="learned, learned:node, oracle or noisy:SIGMA"):
        parse_durations(text)


def test_oracle_is_exact_and_noisy_is_one_error_per_action() -> None:
    assert Durations(DurationMode("oracle")).options(0, "a", SPEC, EXACT) == EXACT
    noisy = Durations(DurationMode("noisy", 0.7), seed=3)
    seen = noisy.options(0, "a", SPEC, EXACT)
    factors = {d / e for (_, d), (_, e) in zip(seen, EXACT, strict=True) if d is not None}
    assert len({round(f, 9) for f in factors}) == 1 and factors != {1.0}
    assert noisy.options(0, "a", SPEC, EXACT) == seen


@pytest.mark.parametrize("per_node", [False, True])
def test_learned_starts_from_the_prior_and_learns_cluster_wide_or_per_node(
        per_node: bool) -> None:
    durations = Durations(DurationMode("learned", per_node=per_node))
    before = durations.options(0, "a", SPEC, EXACT)
    durations.observe(0, SPEC, 1, 8.0)
    durations.observe(0, SPEC, 4, 2.0)
    after = dict(durations.options(0, "b", SPEC, EXACT))
    assert before != tuple(after.items())
    assert after[2] == pytest.approx(4.0, rel=0.05)
    elsewhere = durations.options(1, "c", SPEC, EXACT)
    assert (elsewhere == before) is per_node
    assert per_node or elsewhere == tuple(after.items())


def test_a_grpo_group_teaches_its_later_rollouts() -> None:
    workload = coding(32, 5)
    node = Cluster(cpu_nodes=1, cores_per_node=32, numa_per_node=1)
    runs = {mode: simulate(workload, "tangram", node, SCHEDULING_ONLY,
                           durations=parse_durations(mode)) for mode in ("learned", "oracle")}
    for result in runs.values():
        assert violations(workload, result) == []
    learned = [r for r in runs["learned"].records if r.kind == "test_run"]
    assert len({r.units for r in learned}) > 1


def test_every_run_lasts_its_true_duration_whatever_the_policy_is_told() -> None:
    workload = Workload("one", (Trajectory("a", (SPEC,)),))
    node = Cluster(cpu_nodes=1, cores_per_node=4, numa_per_node=1)
    for mode in ("learned", "oracle", "noisy:2"):
        record = simulate(workload, "tangram", node, SCHEDULING_ONLY,
                          durations=parse_durations(mode)).records[0]
        assert record.exec == pytest.approx(SPEC.duration(record.units))


CALL_A = ActionSpec("reward", 8.0, 0.0, (1, 2, 4), 0.9, service="teacher-a")
CALL_B = ActionSpec("reward", 2.0, 0.0, (1, 2, 4), 0.9, service="teacher-b")


@pytest.mark.parametrize(("spec", "key"), [
    (SPEC, ("test_run", "p0")),
    (ActionSpec("exec", 1.0), ("exec", "")),
    (CALL_A, ("reward", "teacher-a")),
    (ActionSpec("reward", 1.0, service="judge", signature="g1"), ("reward", "judge/g1")),
])
def test_a_gpu_call_is_learned_under_its_model(spec: ActionSpec, key: tuple[str, str]) -> None:
    assert signature(spec) == key


@pytest.mark.parametrize(("seen", "asked", "units", "expected"), [
    ([], CALL_A, 2, None),
    ([(CALL_A, 1, 8.0), (CALL_A, 4, 2.6)], CALL_A, 1, 8.0),
    ([(CALL_A, 1, 8.0), (CALL_A, 4, 2.6)], CALL_A, 4, 2.6),
    ([(CALL_A, 2, 4.4), (CALL_A, 2, 4.4)], CALL_A, 2, 4.4),
    ([(CALL_A, 1, 8.0), (CALL_A, 4, 2.6), (CALL_B, 1, 2.0)], CALL_B, 1, 2.0),
])
def test_the_gpu_learner_fits_each_models_time_per_dop_from_what_was_served(
        seen: list[tuple[ActionSpec, int, float]], asked: ActionSpec, units: int,
        expected: float | None) -> None:
    durations = Durations(DurationMode("learned"))
    prior = dict(durations.options(0, "x", asked, ((1, None), (2, None), (4, None))))
    for spec, dop, seconds in seen:
        durations.observe(0, spec, dop, seconds)
    told = dict(durations.options(0, "y", asked, ((1, None), (2, None), (4, None))))
    if expected is None:
        assert told == prior, "nothing served yet: the prior"
    else:
        assert told[units] == pytest.approx(expected, rel=0.02)


def test_the_gpu_pool_learns_by_default_and_takes_every_mode() -> None:
    workload = mopd(16, 2)
    cluster = Cluster(gpu_nodes=2)
    default = backends(workload, system("tangram"), cluster, SCHEDULING_ONLY, 1)["gpu"]
    assert isinstance(default, GpuPooled) and default.durations.mode.kind == "learned"
    for mode in ("learned", "learned:node", "oracle", "noisy:0.5"):
        built = backends(workload, system("tangram"), cluster, SCHEDULING_ONLY, 1,
                         parse_durations(mode))["gpu"]
        assert isinstance(built, GpuPooled) and built.durations.mode == parse_durations(mode)
    result = simulate(workload, "tangram", cluster, SCHEDULING_ONLY, seed=1)
    assert violations(workload, result) == []
    for record in result.records:
        spec = next(a for t in workload.trajectories if t.id == record.trajectory
                    for a in t.actions)
        assert record.exec == pytest.approx(spec.duration(record.units))


def test_a_learned_gpu_pool_has_seen_every_teacher_it_served() -> None:
    workload = mopd(16, 2)
    built = backends(workload, system("tangram"), Cluster(gpu_nodes=2), SCHEDULING_ONLY, 1)
    gpu = built["gpu"]
    assert isinstance(gpu, GpuPooled)
    Engine(workload, built).run(RunResult("tangram", workload.name, {}))
    model = gpu.durations.models[0]
    served = {a.service for t in workload.trajectories for a in t.actions}
    assert {s for s in served if model.observed(("reward", s))} == served


@pytest.mark.parametrize(("label", "said"), [("learned", False), ("learned:node", True),
                                             ("oracle", True), ("noisy:0.7", True)])
def test_every_mode_but_the_default_is_labelled_an_ablation(label: str, said: bool) -> None:
    assert ("an ablation" in ablation(label)) is said
