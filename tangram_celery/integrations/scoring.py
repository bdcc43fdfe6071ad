"""Running test plans: every solution's tests as tangram actions, all submitted at once.

A pytest plan is one elastic test run (``cpu`` is a range: the node's scheduler picks the cores and
rewrites ``pytest`` to ``pytest -n k``); a stdin/stdout plan is one code action per case, all in the
solution's trajectory. :func:`serial_scores` runs the same plans one after another in the calling
process, with no sandbox: the in-trainer way that tangram is compared against.
"""

from __future__ import annotations

import atexit
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from tangram_celery.action import Action, ActionResult
from tangram_celery.client import TangramClient, code_action, test_run_action
from tangram_celery.errors import ValidationError
from tangram_celery.integrations.cases import (
    PYTEST_ARGS,
    PYTEST_COMMAND,
    SOLUTION_FILE,
    Score,
    TestPlan,
    case_passed,
    pytest_counts,
)
from tangram_celery.sandbox.base import BASE_ENV
from tangram_celery.settings import Settings


@dataclass(frozen=True)
class RewardOptions:
    """How tests are run: cores per pytest run, the per-action time limit, the memory each
    solution's sandbox reserves on its node, the signature under which tangram learns the runs'
    durations and elasticity, the trajectory id prefix, and how long to wait for a whole batch
    (``None``: as long as it takes; a busy pool queues)."""

    cpu: tuple[int, int] = (1, 2)
    timeout_s: float = 60.0
    memory_mb: float = 256.0
    signature: str = "reward-tests"
    trajectory_prefix: str = "reward"
    wait_s: float | None = 1800.0

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> RewardOptions:
        """Options from a trainer's config (verl's ``reward_kwargs``, a tool's ``config``);
        keys that are not options are ignored, a bad value raises ``ValidationError``."""
        known = {f.name for f in fields(cls)}
        picked = {k: v for k, v in values.items() if k in known and v is not None}
        if "cpu" in picked:
            picked["cpu"] = _core_range(picked["cpu"])
        for name in ("timeout_s", "wait_s", "memory_mb"):
            if name in picked and not isinstance(picked[name], int | float):
                raise ValidationError(name, f"expected seconds (a number), got {picked[name]!r}")
        return cls(**picked)


def plan_actions(plan: TestPlan, trajectory_id: str, options: RewardOptions) -> list[Action]:
    """The actions that judge ``plan`` in trajectory ``trajectory_id`` (none for an empty
    solution: a model that answers nothing scores 0 without a sandbox)."""
    if not plan.solution.strip():
        return []
    if plan.pytest_file is not None:
        return [test_run_action(trajectory_id, PYTEST_COMMAND, cpu=options.cpu,
                                files=plan.files(), timeout_s=options.timeout_s,
                                trajectory_memory_mb=options.memory_mb,
                                signature=options.signature)]
    return [code_action(trajectory_id, plan.solution, payload={"stdin": case.stdin},
                        timeout_s=options.timeout_s, trajectory_memory_mb=options.memory_mb,
                        signature=f"{options.signature}-case")
            for case in plan.cases]


def judge(plan: TestPlan, results: Sequence[ActionResult]) -> Score:
    """The score of ``plan`` from the results of its actions, in the order they were built."""
    if not results:
        return Score(0, max(len(plan.cases), 1))
    if plan.pytest_file is not None:
        result = results[0]
        return Score(*pytest_counts(str(result.output.get("stdout", "")), result.ok))
    passed = sum(case_passed(r.ok, str(r.output.get("stdout", "")), case)
                 for r, case in zip(results, plan.cases, strict=True))
    return Score(passed, len(plan.cases))


def score_plans(client: TangramClient, plans: Sequence[TestPlan],
                options: RewardOptions) -> list[Score]:
    """Submit every plan's actions at once, wait for all, end their trajectories, score them."""
    batch = uuid.uuid4().hex[:12]
    trajectories = [f"{options.trajectory_prefix}-{batch}-{i}" for i in range(len(plans))]
    per_plan = [plan_actions(p, t, options) for p, t in zip(plans, trajectories, strict=True)]
    try:
        results = client.run_batch([a for actions in per_plan for a in actions], options.wait_s)
    finally:
        for trajectory in trajectories:
            client.end_trajectory(trajectory)
    scores, start = [], 0
    for plan, actions in zip(plans, per_plan, strict=True):
        scores.append(judge(plan, results[start:start + len(actions)]))
        start += len(actions)
    return scores


def serial_scores(plans: Sequence[TestPlan], options: RewardOptions) -> list[Score]:
    """The same plans run one by one from this process with the ``python3`` the sandboxes find
    on their ``PATH`` (no sandbox, no queue, one core each): the baseline."""
    return [_run_locally(plan, options.timeout_s) for plan in plans]


def _run_locally(plan: TestPlan, timeout_s: float) -> Score:
    if not plan.solution.strip():
        return judge(plan, [])
    with tempfile.TemporaryDirectory(prefix="tangram-serial-") as work:
        if plan.pytest_file is not None:
            for name, text in plan.files().items():
                Path(work, name).write_text(text)
            done = _local([_python(), *PYTEST_ARGS], work, None, timeout_s)
            return Score(*pytest_counts(done[1], done[0]))
        Path(work, SOLUTION_FILE).write_text(plan.solution)
        outcomes = [_local([_python(), SOLUTION_FILE], work, c.stdin, timeout_s)
                    for c in plan.cases]
        passed = sum(case_passed(ok, out, c) for (ok, out), c in zip(outcomes, plan.cases,
                                                                     strict=True))
        return Score(passed, len(plan.cases))


def _python() -> str:
    return shutil.which("python3", path=BASE_ENV["PATH"]) or sys.executable


def _local(argv: list[str], cwd: str, stdin: str | None, timeout_s: float) -> tuple[bool, str]:
    try:
        done = subprocess.run(argv, cwd=cwd, input=stdin or "", capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return False, ""
    return done.returncode == 0, done.stdout


_CLIENTS: dict[str, TangramClient] = {}
_CLIENTS_LOCK = threading.Lock()


def shared_client(settings: Settings | None = None) -> TangramClient:
    """One client per process and settings, made on first use and closed at exit (trainers load
    reward functions and tools by name, so there is nowhere else to keep it)."""
    settings = settings or Settings.from_env()
    key = repr(settings)
    with _CLIENTS_LOCK:
        if key not in _CLIENTS:
            if not _CLIENTS:
                atexit.register(_close_clients)
            _CLIENTS[key] = TangramClient(settings)
        return _CLIENTS[key]


def settings_from(overrides: Mapping[str, Any] | None) -> Settings:
    """Settings from the environment, with a trainer config's ``settings`` mapping on top."""
    if overrides is not None and not isinstance(overrides, Mapping):
        raise ValidationError("settings", "expected a mapping of Settings fields, e.g. "
                              "{'redis_url': 'redis://host:6379/0'}")
    return Settings.from_env(None, **dict(overrides or {}))


def _close_clients() -> None:
    with _CLIENTS_LOCK:
        for client in _CLIENTS.values():
            client.close()
        _CLIENTS.clear()


def _core_range(value: Any) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value, value
    whole = isinstance(value, Sequence) and len(value) == 2 and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value)
    if whole and 1 <= value[0] <= value[1]:
        return int(value[0]), int(value[1])
    raise ValidationError("cpu", f"expected a core count or a [min, max] range, got {value!r}")
