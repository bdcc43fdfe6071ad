"""Workload generators and the JSON Lines trace format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tangram_bench.workloads import (
    ActionSpec,
    CodingParams,
    build,
    coding,
    deepsearch,
    mopd,
    parse_trace,
    read_trace,
    write_trace,
)
from tangram_bench.workloads.model import Trajectory, Workload
from tangram_bench.workloads.trace import TraceError, format_trace


@pytest.mark.parametrize("name", ["coding", "mopd", "deepsearch"])
def test_same_seed_same_workload_and_batches_are_prefixes(name: str) -> None:
    small, again, large = build(name, 16, 5), build(name, 16, 5), build(name, 32, 5)
    assert small == again
    assert build(name, 16, 6) != small
    if name != "mopd":
        assert large.trajectories[:16] == small.trajectories


def test_coding_shape() -> None:
    workload = coding(200, 1)
    for trajectory in workload.trajectories:
        *execs, test = trajectory.actions
        assert 8 <= len(execs) <= 24
        assert all(a.kind == "exec" and a.units == (1,) and not a.elastic for a in execs)
        assert all(0.001 <= a.t1 <= 60.0 for a in execs)
        assert test.kind == "test_run" and test.elastic and test.units == tuple(range(1, 33))
        assert 0.5 <= test.parallel <= 0.99
    fixed = coding(4, 1, CodingParams(parallel=0.7))
    assert {t.actions[-1].parallel for t in fixed.trajectories} == {0.7}


def test_amdahl_duration() -> None:
    spec = ActionSpec("test_run", 10.0, units=(1, 2, 4), parallel=0.8)
    assert spec.duration(1) == pytest.approx(10.0)
    assert spec.duration(4) == pytest.approx(10.0 * (0.2 + 0.2))
    assert spec.speedup(4) == pytest.approx(2.5)


def test_mopd_invocation_counts_swing_between_steps() -> None:
    workload = mopd(400, 3)
    counts = {}
    for trajectory in workload.trajectories:
        key = (trajectory.step, trajectory.actions[0].service)
        counts[key] = counts.get(key, 0) + 1
    services = [s.name for s in workload.services]
    swings = [max(counts.get((step, s), 0) for step in range(4))
              / max(min(counts.get((step, s), 0) for step in range(4)), 1) for s in services]
    assert max(swings) >= 20
    assert all(a.units == workload.service(a.service).dops
               for t in workload.trajectories for a in t.actions)


def test_deepsearch_calls_then_judge() -> None:
    workload = deepsearch(20, 2)
    for trajectory in workload.trajectories:
        *calls, judge = trajectory.actions
        assert calls and all(a.kind == "api" and a.service == "search" for a in calls)
        assert judge.kind == "reward" and judge.units == (1, 2, 4)


@pytest.mark.parametrize("name", ["coding", "mopd", "deepsearch"])
def test_trace_round_trip(name: str, tmp_path: Path) -> None:
    workload = build(name, 12, 3)
    path = tmp_path / "trace.jsonl"
    write_trace(path, workload)
    replayed = read_trace(path)
    assert replayed.trajectories == workload.trajectories
    assert replayed.services == workload.services and replayed.apis == workload.apis


def test_trace_one_action_a_line_in_any_order() -> None:
    lines = [
        '{"type": "service", "name": "rm", "dops": [1, 2], "weights_gb": 8}',
        "# a comment",
        '{"trajectory": "b", "index": 1, "kind": "reward", "t1": 2, "units": {"set": [1, 2]},'
        ' "parallel": 0.5, "service": "rm"}',
        '{"trajectory": "a", "index": 0, "kind": "exec", "t1": 0.1, "start_s": 3}',
        '{"trajectory": "b", "index": 0, "kind": "test_run", "t1": 5, "units": [1, 4],'
        ' "think_s": 1, "parallel": 0.9, "step": 1}',
    ]
    workload = parse_trace(lines)
    by_id = {t.id: t for t in workload.trajectories}
    assert by_id["a"].start_s == 3 and by_id["a"].actions[0].units == (1,)
    assert by_id["b"].step == 1
    assert [a.kind for a in by_id["b"].actions] == ["test_run", "reward"]
    assert by_id["b"].actions[0].units == (1, 2, 3, 4)


@pytest.mark.parametrize("line, field", [
    ('{"trajectory": "a", "index": 0, "kind": "reward", "t1": 1, "service": "x"}', "x"),
    ('{"trajectory": "a", "index": 0, "kind": "exec", "t1": -1}', "t1"),
    ('{"trajectory": "a", "index": 0, "kind": "exec", "t1": 1, "units": [4, 1]}', "units"),
    ("[1, 2]", "object"),
    ("not json", "not a JSON object.*docs/traces.md"),
    ('{"actions": [{"kind": "exec", "t1": 1}]}', "required field 'id' is missing"),
    ('{"trajectory": "a", "kind": "exec", "t1": 1}', "required field 'index' is missing"),
    ('{"trajectory": "a", "index": 0, "t1": 1}', "required field 'kind' is missing"),
    ('{"type": "service", "name": "rm"}', "required field 'dops' is missing"),
    ('{"type": "nope"}', "unknown line type 'nope'"),
])
def test_bad_trace_lines_name_the_problem(line: str, field: str) -> None:
    with pytest.raises(TraceError, match=field):
        parse_trace([line])


EXEC = '"kind": "exec", "t1": 1'


@pytest.mark.parametrize("lines, problem", [
    ([f'{{"id": "a", "actions": [{{{EXEC}}}]}}'] * 2, "line 2: trajectory 'a' appears twice"),
    ([f'{{"trajectory": "a", "index": 0, {EXEC}}}'] * 2, "line 2: .*already has an action 0"),
    ([f'{{"id": "a", "actions": [{{{EXEC}}}]}}', f'{{"trajectory": "a", "index": 1, {EXEC}}}'],
     "line 2: .*already has a trajectory line"),
    ([f'{{"trajectory": "a", "index": 0, {EXEC}}}', f'{{"id": "a", "actions": [{{{EXEC}}}]}}'],
     "line 2: trajectory 'a' appears twice"),
    ([], "no trajectory or action lines"),
    (["# only a comment", '{"type": "workload", "name": "x"}'], "no trajectory or action"),
])
def test_a_trace_never_loses_or_merges_trajectories_silently(lines: list[str],
                                                            problem: str) -> None:
    with pytest.raises(TraceError, match=problem):
        parse_trace(lines)


def test_unreadable_trace_files_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"cannot read the trace file .*missing\.jsonl"):
        read_trace(tmp_path / "missing.jsonl")
    with pytest.raises(TraceError, match="cannot read the trace file"):
        read_trace(tmp_path)
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe{}\n")
    with pytest.raises(TraceError, match="not UTF-8 text"):
        read_trace(binary)


def test_format_is_json_lines() -> None:
    lines = list(format_trace(coding(2, 1)))
    assert all(isinstance(json.loads(line), dict) for line in lines)
    assert json.loads(lines[0])["type"] == "workload"


def test_a_trajectory_needs_an_action() -> None:
    with pytest.raises(TraceError, match="at least one action"):
        parse_trace(['{"type": "trajectory", "id": "empty", "actions": []}'])


def test_grpo_groups_share_a_suite_and_a_signature() -> None:
    workload = coding(24, 4, CodingParams(group=8))
    tests = [t.actions[-1] for t in workload.trajectories]
    for first in range(0, 24, 8):
        members = tests[first:first + 8]
        assert len({a.signature for a in members}) == 1
        assert len({a.parallel for a in members}) == 1
        assert max(a.t1 for a in members) / min(a.t1 for a in members) < 4
    assert len({a.signature for a in tests}) == 3
    alone = coding(4, 4, CodingParams(group=1))
    assert len({t.actions[-1].signature for t in alone.trajectories}) == 4
    with pytest.raises(ValueError, match="group"):
        CodingParams(group=0)


def test_the_no_queue_bound_runs_every_action_alone_at_its_largest_count() -> None:
    exec_action = ActionSpec("exec", 2.0)
    test_run = ActionSpec("test_run", 10.0, units=(1, 2, 4), parallel=0.5)
    workload = Workload("w", (Trajectory("a", (exec_action, test_run)),
                              Trajectory("b", (exec_action,))))
    assert workload.unqueued_external_s() == pytest.approx((2 + 10 * 0.625 + 2) / 2)
    assert mopd(4, 1).unqueued_external_s() is None
    assert Workload("empty", ()).unqueued_external_s() is None
