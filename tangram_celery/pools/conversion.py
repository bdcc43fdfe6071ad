"""What a pool makes of an action and of its outcome: pure conversions, no I/O.

The validation bounds that follow from the settings, the admission request of an action (and the
scheduler's view of it), the sandbox exec spec of a CPU action, and the result fields of a
sandboxed command's outcome. CPU nodes (:mod:`tangram_celery.pools.cpu_pool.node`), GPU pools
and API pools use them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from tangram_celery.action import Action, ActionLimits
from tangram_celery.pools.admission import Request
from tangram_celery.pools.session import session_program
from tangram_celery.sandbox import ExecOutcome, ExecSpec, rewrite_parallelism
from tangram_celery.sandbox.base import INSIDE_WORKDIR
from tangram_celery.sandbox.malleable import is_pytest_command, malleable_command, runner_files
from tangram_celery.scheduling import DurationModel, Job, Signature
from tangram_celery.scheduling.learned import learned_options
from tangram_celery.settings import Settings

SANDBOX_PYTHON = "/usr/bin/python3"
MALLEABLE_RUNNER = ".tangram-runner"
"""Where a malleable test run's runner modules go in the work dir (for the step only)."""
MALLEABLE_CONTROL = ".tangram-malleable.sock"
"""A malleable run's control socket in the work dir, reachable from the node."""
FETCH_TIMEOUT_S = 30.0
FETCH_CAP_BYTES = 16 * 1024 * 1024
"""Output cap of the fetch step (base64 of the files), unless the action gives its own."""
FETCH_SCRIPT = (
    "import base64, json, os, sys\n"
    "found = {{}}\n"
    "for path in {paths}:\n"
    "    if os.path.isfile(path):\n"
    "        with open(path, 'rb') as fh:\n"
    "            found[path] = base64.b64encode(fh.read()).decode()\n"
    "sys.stdout.write(json.dumps(found))\n"
)


def action_limits(settings: Settings) -> ActionLimits:
    """The validation bounds that follow from the settings."""
    return ActionLimits(
        max_payload_bytes=settings.actions.max_payload_bytes,
        max_timeout_s=settings.actions.max_timeout_s,
        apis=frozenset(api_names(settings.api.limits)),
        extra_resources=frozenset(settings.actions.extra_resources),
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
    to the command, ``cpus`` the host CPUs it is pinned to. A ``steps`` action's first step
    (:func:`exec_specs` gives them all)."""
    return exec_specs(action, units, cpus, default_timeout_s)[0]


def exec_specs(
    action: Action, units: tuple[int, ...], cpus: tuple[int, ...], default_timeout_s: float,
    *, malleable: bool | None = None,
) -> list[ExecSpec]:
    """The exec specs of a CPU action: one, or one per step of a ``steps`` payload (the
    action's files arrive with the first; each step has its own stdin and timeout). Its
    pytest invocations become malleable runs when ``malleable`` (None: when the action says
    ``"malleable": true``), else ``pytest -n <units>``."""
    payload = action.payload
    malleable = bool(payload.get("malleable")) if malleable is None else malleable
    steps = payload.get("steps") or [payload]
    files = dict(payload.get("files", {}))
    specs = []
    for i, step in enumerate(steps):
        spec = _step_spec(action, step, files if i == 0 else {}, units, cpus,
                          default_timeout_s, str(i) if len(steps) > 1 else "", malleable)
        specs.append(spec)
    return specs


def fetch_spec(action: Action, cpus: tuple[int, ...]) -> ExecSpec | None:
    """The spec that prints the action's ``fetch`` files as ``{path: base64}`` JSON (run in
    the warm interpreter, its own output cap); None when it names none."""
    paths = action.payload.get("fetch") or []
    if not paths:
        return None
    snippet = f".tangram-fetch-{action.id}.py"
    script = FETCH_SCRIPT.format(paths=json.dumps(paths))
    return ExecSpec(
        trajectory_id=action.trajectory_id, python=snippet, files={snippet: script},
        command=f"{SANDBOX_PYTHON} {snippet}; s=$?; rm -f {snippet}; exit $s",
        timeout_s=FETCH_TIMEOUT_S, cores=cpus, memory_mb=action.payload.get("memory_mb"),
        output_cap_bytes=action.payload.get("output_cap_bytes") or FETCH_CAP_BYTES,
    )


def _step_spec(
    action: Action, step: Mapping[str, Any], files: dict[str, str], units: tuple[int, ...],
    cpus: tuple[int, ...], default_timeout_s: float, tag: str, malleable: bool,
) -> ExecSpec:
    payload = action.payload
    python = None
    env: dict[str, str] = dict(payload.get("env", {}))
    session = bool(payload.get("session")) and "code" in step
    if "code" in step:
        python = f".tangram-{action.id}{tag}.py"
        code = str(step["code"])
        files = {**files, python: session_program(code) if session else code}
        command = f"{SANDBOX_PYTHON} {python}; s=$?; rm -f {python}; exit $s"
    else:
        command = str(step["cmd"])
        if malleable and is_pytest_command(command):
            command, files, env = _malleable(command, files, env, len(units))
        else:
            command = rewrite_parallelism(command, len(units))
    return ExecSpec(
        trajectory_id=action.trajectory_id,
        command=command,
        files=files,
        timeout_s=step.get("timeout_s") or action.timeout_s or default_timeout_s,
        cores=cpus,
        env={**env, "TANGRAM_UNITS": str(len(units))},
        stdin=step.get("stdin"),
        python=python,
        memory_mb=payload.get("memory_mb"),
        output_cap_bytes=payload.get("output_cap_bytes"),
        keep_processes=session,
    )


def _malleable(command: str, files: dict[str, str], env: dict[str, str], units: int,
               ) -> tuple[str, dict[str, str], dict[str, str]]:
    """A pytest step as a malleable run of ``units`` workers: the runner's modules go in with
    the step's files (and are removed after it), its control socket is in the work dir."""
    runner = f"{INSIDE_WORKDIR}/{MALLEABLE_RUNNER}"
    path = ":".join(p for p in (runner, env.get("PYTHONPATH", "")) if p)
    command = malleable_command(command, units, control=f"{INSIDE_WORKDIR}/{MALLEABLE_CONTROL}")
    return (f"{command}; s=$?; rm -rf {runner}; exit $s",
            {**files, **runner_files(MALLEABLE_RUNNER)}, {**env, "PYTHONPATH": path})


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
        "exec_s": round(outcome.exec_s, 6),
        "environment_replaced": outcome.environment_replaced,
        "replaced_reason": outcome.replaced_reason,
    }


def scheduler_job(request: Request) -> Job:
    """The scheduler's view of an admission request (elastic when it has several counts, all
    with known durations)."""
    known = all(d is not None for _, d in request.options)
    return Job(request.id, "cpu", request.options, request.arrived,
               elastic=known and len(request.options) > 1)
