"""The CPU node runtime: what a node worker does with each action message.

It validates the message again (workers never trust producers), waits in the node's admission
gate for exclusive cores, runs the command in the trajectory's sandbox on exactly those cores,
gives the cores back whatever happens, and returns the result with its timestamps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tangram_celery.action import Action, ActionLimits, ActionResult, Timings, parse_action
from tangram_celery.admission import Admission, Policy, Request, fcfs_minimum
from tangram_celery.errors import SandboxError, ValidationError
from tangram_celery.registry import Registry
from tangram_celery.sandbox import ExecOutcome, ExecSpec, SandboxBackend, rewrite_parallelism
from tangram_celery.scheduling import DurationModel, Signature
from tangram_celery.serving import Heartbeat, rejected_result
from tangram_celery.settings import Settings

log = logging.getLogger(__name__)

SANDBOX_PYTHON = "/usr/bin/python3"


def action_limits(settings: Settings) -> ActionLimits:
    """The validation bounds that follow from the settings."""
    return ActionLimits(
        max_payload_bytes=settings.max_payload_bytes,
        max_timeout_s=settings.max_timeout_s,
        apis=frozenset(api_names(settings.api_limits)),
        extra_resources=frozenset(settings.extra_resources),
    )


def api_names(api_limits: str) -> list[str]:
    """Names of the APIs declared in ``TANGRAM_API_LIMITS``; raises ``ConfigError`` if malformed
    (format: :mod:`tangram_celery.managers.basic`)."""
    from tangram_celery.managers.basic import parse_api_limits

    return list(parse_api_limits(api_limits))


def signature_of(action: Action, key: str | None = None) -> Signature:
    """The duration model's key of an action: its kind and the submitter's signature (or
    ``key`` in its place, e.g. a GPU pool's fallback to the reward model's name)."""
    return (action.kind, action.signature if key is None else key)


def request_for(
    action: Action,
    arrived: float,
    model: DurationModel | None = None,
    allowed: Sequence[int] | None = None,
    key: str | None = None,
) -> Request:
    """The admission request of an action: allowed unit counts with expected durations.

    An action without elasticity may only get its minimum. Durations come from its own T1 and
    E(m) when given, else from the online model once it knows the action's signature, else
    they are unknown (the scheduler then admits the action at its minimum). ``allowed`` narrows
    the unit counts to those the pool can serve (default: the cost vector's, ascending);
    ``key`` replaces the signature in the model's key (see :func:`signature_of`).
    """
    allowed = action.units().allowed_units() if allowed is None else tuple(allowed)
    if action.elasticity is None:
        allowed = allowed[:1]
    signature = signature_of(action, key)
    if action.t1 is not None:
        options = tuple((m, action.expected_duration(m)) for m in allowed)
    elif model is not None and signature[1] and model.known(signature):
        options = model.options(signature, allowed)
    else:
        options = tuple((m, None) for m in allowed)
    return Request(action.id, options, arrived, action.signature)


def exec_spec(
    action: Action, units: tuple[int, ...], cpus: tuple[int, ...], default_timeout_s: float
) -> ExecSpec:
    """Turn a CPU action into the sandbox's exec spec: ``len(units)`` is the parallelism handed
    to the command, ``cpus`` the host CPUs it is pinned to."""
    payload = action.payload
    files = dict(payload.get("files", {}))
    if "code" in payload:
        snippet = f".tangram-{action.id}.py"
        files[snippet] = str(payload["code"])
        command = f"{SANDBOX_PYTHON} {snippet}; s=$?; rm -f {snippet}; exit $s"
    else:
        command = rewrite_parallelism(str(payload["cmd"]), len(units))
    return ExecSpec(
        trajectory_id=action.trajectory_id,
        command=command,
        files=files,
        timeout_s=action.timeout_s or default_timeout_s,
        cores=cpus,
        env={**payload.get("env", {}), "TANGRAM_UNITS": str(len(units))},
        stdin=payload.get("stdin"),
    )


def outcome_status(outcome: ExecOutcome) -> str:
    """``ok``, ``failed`` (non-zero exit or signal) or ``timeout``."""
    if outcome.timed_out:
        return "timeout"
    return "ok" if outcome.exit_code == 0 else "failed"


def outcome_output(outcome: ExecOutcome) -> dict[str, Any]:
    """The JSON output of a sandboxed command."""
    return {
        "exit_code": outcome.exit_code,
        "signal": outcome.signal,
        "timed_out": outcome.timed_out,
        "oom_killed": outcome.oom_killed,
        "stdout": outcome.stdout,
        "stderr": outcome.stderr,
        "stdout_truncated": outcome.stdout_truncated,
        "stderr_truncated": outcome.stderr_truncated,
        "environment_replaced": outcome.environment_replaced,
        "replaced_reason": outcome.replaced_reason,
    }


class CpuNode:
    """One CPU node: its cores, its sandboxes, its admission gate and its Redis registration."""

    def __init__(
        self,
        settings: Settings,
        name: str,
        cores: int,
        cpus: Sequence[int],
        memory_mb: float,
        sandbox: SandboxBackend,
        registry: Registry | None = None,
        policy: Policy = fcfs_minimum,
        model: DurationModel | None = None,
    ) -> None:
        self.settings = settings
        self.name = name
        self.memory_mb = memory_mb
        self.sandbox = sandbox
        self.registry = registry
        self.admission = Admission(range(cores), policy)
        self.cpus = tuple(cpus)
        self.model = model or DurationModel()
        self._limits = action_limits(settings)
        self._heartbeat = Heartbeat(f"tangram-heartbeat-{name}", settings.node_heartbeat_s,
                                    self._beat)

    def start(self) -> None:
        """Register the node and start its heartbeat."""
        if self.registry is None:
            return
        self.registry.register_node(self.name, self.admission.total, self.memory_mb)
        self._heartbeat.start()

    def stop(self) -> None:
        """Deregister, stop the heartbeat and remove every sandbox of this node."""
        self._heartbeat.stop()
        if self.registry is not None:
            try:
                self.registry.deregister_node(self.name)
            except Exception:
                log.warning("could not deregister node %s", self.name, exc_info=True)
        self.sandbox.close()

    def execute(self, message: Mapping[str, Any], received: float) -> dict[str, Any]:
        """Run one action message to completion; never raises for a bad message."""
        try:
            action = parse_action(message, self._limits)
        except ValidationError as exc:
            return rejected_result(message, str(exc), self.name, received)
        if action.pool != "cpu":
            return rejected_result(message, f"{action.kind} actions do not run on CPU nodes",
                                   self.name, received)
        return self._run(action, received).to_json()

    def physical(self, units: Sequence[int]) -> tuple[int, ...]:
        """The host CPUs backing logical unit ids (units share CPUs when oversubscribed)."""
        return tuple(sorted({self.cpus[u % len(self.cpus)] for u in units}))

    def end_trajectory(self, trajectory_id: str) -> None:
        """Remove a trajectory's environment and give its memory reservation back."""
        self.sandbox.end_trajectory(trajectory_id)
        if self.registry is not None:
            self.registry.unpin(trajectory_id)

    def _run(self, action: Action, received: float) -> ActionResult:
        timings = Timings(received=received)
        result = ActionResult(action.id, action.trajectory_id, action.kind, "error",
                              node=self.name, timings=timings)
        cores = self.admission.acquire(request_for(action, received, self.model))
        timings.admitted = time.time()
        result.units = cores
        try:
            spec = exec_spec(action, cores, self.physical(cores), self.settings.default_timeout_s)
            outcome = self.sandbox.run(spec)
        except (SandboxError, ValidationError) as exc:
            result.error = str(exc)
            timings.exec_started = timings.exec_finished = time.time()
        else:
            result.status = outcome_status(outcome)
            result.output = outcome_output(outcome)
            timings.exec_started, timings.exec_finished = outcome.started_at, outcome.finished_at
            timings.exec_s, timings.setup_s = outcome.exec_s, outcome.setup_s
            if action.signature and not outcome.timed_out:
                self.model.observe(signature_of(action), len(cores), outcome.exec_s)
        finally:
            self._close_allocation(action.id)
        timings.stored = time.time()
        return result

    def _close_allocation(self, action_id: str) -> None:
        record = self.admission.release(action_id)
        if record is None or self.registry is None:
            return
        try:
            self.registry.record_allocation(self.name, {
                "action_id": record.action_id, "units": list(record.units),
                "start": record.start, "end": record.end, "total": self.admission.total,
            })
        except Exception:  # the audit trail must not fail the action
            log.warning("could not record the allocation of %s", action_id, exc_info=True)

    def _beat(self) -> None:
        if self.registry is not None:
            self.registry.heartbeat(self.name, self.admission.free_count())
