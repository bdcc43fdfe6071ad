"""What one ``/run_code`` request becomes: one action, and what its result means to the client.

Pure. A request is one action whose payload holds its steps (:func:`request_action`): the
compile step of a compiled language and the run step, each with its own timeout, both under the
request's memory limit, run one after the other in one sandbox; the files the request fetches
are read after them, whatever they did. A request without a trajectory name is ``ephemeral``:
it runs in a recycled sandbox and its trajectory ends on the node with it, so it costs one
action and no end message. :func:`command_results` reads the result as SandboxFusion's
``compile_result`` and ``run_result``.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tangram_celery.action import Action, ActionResult, parse_action
from tangram_celery.gateway.languages import Language
from tangram_celery.gateway.protocol import ERROR, FINISHED, TIME_LIMIT, CommandResult, RunRequest

OOM_NOTE = "tangram: the program was killed: out of memory (its limit: {mb} MB)\n"


@dataclass(frozen=True)
class StepConfig:
    """What shapes the actions besides the request: the memory an action gets when the
    request says -1 (MB), the most cores a ``pytest`` run may get, and the output cap."""

    memory_default_mb: int = 512
    pytest_max_cores: int = 4
    output_cap_bytes: int = 8 * 1024 * 1024


def request_files(request: RunRequest) -> dict[str, str]:
    """The request's files as action payload text (bytes that are not UTF-8 travel as
    surrogate escapes and are written back byte for byte)."""
    return {path: data.decode("utf-8", "surrogateescape") for path, data in request.files.items()}


def pytest_signature(request: RunRequest, header: str | None) -> str:
    """The key under which a ``pytest`` run's durations are learned: the header, else the
    request's ``signature`` field, else a hash of its files (of its code when it has none)."""
    if header:
        return header[:200]
    if request.signature:
        return request.signature
    digest = hashlib.sha256()
    if request.files:
        for path in sorted(request.files):
            digest.update(path.encode() + b"\0" + request.files[path] + b"\0")
    else:
        digest.update(request.code.encode("utf-8", "surrogateescape"))
    return "files-" + digest.hexdigest()[:32]


def memory_mb(request: RunRequest, config: StepConfig) -> int:
    """The request's memory limit in MB: its own, or the default for -1 (never lowered)."""
    return request.memory_limit_mb if request.memory_limit_mb > 0 else config.memory_default_mb


def request_action(
    request: RunRequest, language: Language, trajectory_id: str, config: StepConfig,
    signature: str = "", ephemeral: bool = True, session: bool = False,
) -> Action:
    """The one action of a request: its steps, files, memory and the files to fetch."""
    action_id = uuid.uuid4().hex
    source = language.source_name(action_id)
    files = {**request_files(request), **dict(language.extra)}
    steps: list[dict[str, Any]] = []
    run: dict[str, Any] = {"timeout_s": request.run_timeout}
    if request.stdin is not None:
        run["stdin"] = request.stdin
    if language.name == "python":
        run["code"] = request.code
    else:
        files[source] = language.source_text(request.code)
        if language.compile is not None:
            steps.append({"cmd": language.compile.format(src=source),
                          "timeout_s": request.compile_timeout})
        run["cmd"] = language.run.format(src=source)
    steps.append(run)
    memory = memory_mb(request, config)
    payload: dict[str, Any] = {
        "steps": steps, "files": files, "memory_mb": memory,
        "output_cap_bytes": config.output_cap_bytes,
        "env": {**dict(language.env), "TANGRAM_MEMORY_MB": str(memory)},
    }
    if request.fetch_files:
        payload["fetch"] = list(request.fetch_files)
    if session:
        payload["session"] = True
    body: dict[str, Any] = {
        "id": action_id, "trajectory_id": trajectory_id, "kind": "exec", "payload": payload,
        "cost": {"cpu": 1}, "ephemeral": ephemeral, "trajectory_memory_mb": memory,
        "timeout_s": request.compile_timeout + request.run_timeout,
    }
    if language.elastic:
        body.update(kind="test_run", cost={"cpu": [1, max(config.pytest_max_cores, 1)]},
                    elasticity="linear", signature=signature or None)
    return parse_action(body)


def command_results(result: ActionResult, compiled: bool, memory: int = 0
                    ) -> tuple[CommandResult | None, CommandResult | None]:
    """(compile_result, run_result) of a request's action, as SandboxFusion writes them: a
    run that was never reached (its compile failed) is None; when the sandbox could not run
    the request, the step it failed in is ``Error`` with the reason."""
    if result.status not in ("ok", "failed", "timeout"):
        reason = result.error or f"the action ended with status {result.status!r}"
        failed = CommandResult(ERROR, None, None, None, f"tangram: {reason}")
        return (failed, None) if compiled else (None, failed)
    steps = result.output.get("steps") or [result.output]
    read = [_step_result(step, memory) for step in steps]
    if compiled:
        return read[0], read[1] if len(read) > 1 else None
    return None, read[-1]


def fetched(result: ActionResult) -> tuple[dict[str, str], str]:
    """The fetched files (``{path: base64}``) and, when fetching failed, why."""
    files = result.output.get("files") or {}
    problem = str(result.output.get("fetch_error") or "")
    return {str(k): str(v) for k, v in dict(files).items()}, problem


def _step_result(step: Mapping[str, Any], memory: int) -> CommandResult:
    stdout, stderr = step.get("stdout"), step.get("stderr")
    took = step.get("exec_s")
    if step.get("oom_killed"):
        stderr = f"{stderr or ''}{OOM_NOTE.format(mb=memory or '?')}"
    if step.get("timed_out"):
        return CommandResult(TIME_LIMIT, took, None, stdout, stderr)
    code = step.get("exit_code")
    return CommandResult(FINISHED, took, None if code is None else int(code), stdout, stderr)


def time_split(result: ActionResult, request_s: float) -> dict[str, float]:
    """Where a request's ``request_s`` seconds (inside the gateway) went: ``program`` (the
    steps' commands), ``sandbox`` (the node's work around them: files, cgroups, the sandbox's
    lease and fetch), ``broker`` (routing, queues, waiting for cores, result delivery) and
    ``gateway`` (the rest: building the action, its answer)."""
    t = result.timings
    program = t.exec_s
    sandbox = max(t.stored - t.admitted - program, 0.0)
    broker = max(t.admitted - t.published, 0.0) + max(t.completed - t.stored, 0.0)
    gateway = max(request_s - program - sandbox - broker, 0.0)
    return {"gateway": gateway, "broker": broker, "sandbox": sandbox, "program": program}
