"""What a pool makes of an action and of its outcome: pure conversions, no I/O.

The validation bounds that follow from the settings, the admission request of an action (and the
scheduler's view of it), the sandbox exec spec of a CPU action, and the result fields of a
sandboxed command's outcome. CPU nodes (:mod:`tangram_celery.pools.node`), GPU pools and API
pools use them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tangram_celery.action import Action, ActionLimits
from tangram_celery.pools.admission import Request
from tangram_celery.sandbox import ExecOutcome, ExecSpec, rewrite_parallelism
from tangram_celery.scheduling import DurationModel, Job, Signature
from tangram_celery.scheduling.learned import learned_options
from tangram_celery.settings import Settings

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
    (format: :mod:`tangram_celery.managers.basic.limits`)."""
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
    prior: bool = False,
) -> Request:
    """The admission request of an action: allowed unit counts with expected durations.

    An action without elasticity may only get its minimum. Durations come from its own T1 and
    E(m) when given, else from the online model: with ``prior`` (CPU nodes) an elastic
    action's from what it learned of the signature, of its kind, or a prior
    (:func:`~tangram_celery.scheduling.learned.learned_options`, so a new signature is tried at
    several counts), otherwise once the model knows its signature; else they are unknown (the
    scheduler then admits the action at its minimum). ``allowed`` narrows
    the unit counts to those the pool can serve (default: the cost vector's, ascending);
    ``key`` replaces the signature in the model's key (see :func:`signature_of`).
    """
    allowed = action.units().allowed_units() if allowed is None else tuple(allowed)
    if action.elasticity is None:
        allowed = allowed[:1]
    signature = signature_of(action, key)
    if action.t1 is not None:
        options = tuple((m, action.expected_duration(m)) for m in allowed)
    elif prior and model is not None and signature[1] and len(allowed) > 1:
        options = learned_options(model, signature, allowed)
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
    python = None
    if "code" in payload:
        snippet = f".tangram-{action.id}.py"
        files[snippet] = str(payload["code"])
        command = f"{SANDBOX_PYTHON} {snippet}; s=$?; rm -f {snippet}; exit $s"
        python = snippet
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
        python=python,
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
        "stdout_cut_bytes": outcome.stdout_cut_bytes,
        "stderr_cut_bytes": outcome.stderr_cut_bytes,
        "environment_replaced": outcome.environment_replaced,
        "replaced_reason": outcome.replaced_reason,
    }


def scheduler_job(request: Request) -> Job:
    """The scheduler's view of an admission request (elastic when it has several counts, all
    with known durations)."""
    known = all(d is not None for _, d in request.options)
    return Job(request.id, "cpu", request.options, request.arrived,
               elastic=known and len(request.options) > 1)
