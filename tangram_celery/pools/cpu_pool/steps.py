"""Running one CPU action on its cores: its steps, the files it fetches, its one-request sandbox.

An action is one command, or a ``steps`` payload: commands run one after the other in the same
sandbox (a compile step, then the run), where the first one that does not exit 0 ends the
action. Its ``fetch`` files are read afterwards, whatever the steps did. An ``ephemeral``
action (its trajectory lives for this request only) runs in a recycled sandbox where the backend
keeps them (:func:`~tangram_celery.sandbox.lease.one_request`). The result's output is the last
step's, with every step's under ``steps`` and the fetched files under ``files``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tangram_celery.action import Action
from tangram_celery.pools.conversion import exec_specs, fetch_spec, outcome_output
from tangram_celery.sandbox import ExecOutcome, SandboxBackend
from tangram_celery.sandbox.lease import one_request


@dataclass(frozen=True)
class Ran:
    """What the action's steps did: each step's outcome, and its output as JSON."""

    outcomes: tuple[ExecOutcome, ...]
    output: dict[str, Any]

    @property
    def last(self) -> ExecOutcome:
        """The step that ended the action."""
        return self.outcomes[-1]

    @property
    def exec_s(self) -> float:
        """Time spent in the steps' commands."""
        return sum(o.exec_s for o in self.outcomes)


def run_action(sandbox: SandboxBackend, action: Action, units: tuple[int, ...],
               cpus: tuple[int, ...], default_timeout_s: float, *,
               malleable: bool | None = None) -> Ran:
    """Run ``action``'s steps (and fetch its files) on ``cpus``, its pytest runs malleable
    as ``malleable`` says (None: as the action says); raises what the sandbox raises."""
    if not action.ephemeral:
        return _run_steps(sandbox, action, units, cpus, default_timeout_s, malleable)
    with one_request(sandbox, action.trajectory_id):
        return _run_steps(sandbox, action, units, cpus, default_timeout_s, malleable)


def _run_steps(sandbox: SandboxBackend, action: Action, units: tuple[int, ...],
               cpus: tuple[int, ...], default_timeout_s: float, malleable: bool | None) -> Ran:
    outcomes: list[ExecOutcome] = []
    for spec in exec_specs(action, units, cpus, default_timeout_s, malleable=malleable):
        outcome = sandbox.run(spec)
        outcomes.append(outcome)
        if outcome.timed_out or outcome.exit_code != 0:
            break
    output = outcome_output(outcomes[-1])
    if "steps" in action.payload:
        output["steps"] = [outcome_output(o) for o in outcomes]
    fetch = fetch_spec(action, cpus)
    if fetch is not None:
        output["files"], problem = fetched_files(sandbox.run(fetch))
        if problem:
            output["fetch_error"] = problem
    return Ran(tuple(outcomes), output)


def fetched_files(outcome: ExecOutcome) -> tuple[dict[str, str], str]:
    """The ``{path: base64}`` the fetch step printed, and what went wrong ('' when nothing)."""
    if outcome.stdout_truncated:
        return {}, ("the fetched files are larger than the fetch cap (payload "
                    "'output_cap_bytes'); fetch fewer or smaller files")
    if outcome.timed_out or outcome.exit_code != 0:
        return {}, f"the fetch step failed: {outcome.stderr[-500:] or outcome.exit_code}"
    try:
        found = json.loads(outcome.stdout or "{}")
    except ValueError:
        return {}, "the fetch step printed no JSON"
    if not isinstance(found, Mapping):
        return {}, "the fetch step printed no JSON object"
    return {str(k): str(v) for k, v in found.items()}, ""
