"""What the pooled systems' policies are told: learned (default), oracle, noisy."""

from __future__ import annotations

import pytest

from tangram_bench.sim.cluster import Cluster
from tangram_bench.sim.costs import SCHEDULING_ONLY
from tangram_bench.sim.durations import DurationMode, Durations, parse_durations
from tangram_bench.sim.invariants import violations
from tangram_bench.sim.systems import simulate
from tangram_bench.workloads import ActionSpec, Trajectory, Workload, coding

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
