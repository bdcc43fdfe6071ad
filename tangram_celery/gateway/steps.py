"""What one ``/run_code`` request becomes: its actions, and what their results mean to the client.

Pure. A request is up to three actions in one trajectory, run one after the other: the compile
step (compiled languages), the run step (an ``exec`` action, or for ``pytest`` an elastic
``test_run`` over a range of cores), and a fetch step when ``fetch_files`` names files. The
request's files arrive with the first step. :func:`command_result` reads an action's result as
SandboxFusion's ``CommandRunResult``; :func:`fetched_files` reads the fetch step's output.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tangram_celery.action import Action, ActionResult
from tangram_celery.client import code_action, command_action, test_run_action
from tangram_celery.gateway.languages import Language
from tangram_celery.gateway.protocol import ERROR, FINISHED, TIME_LIMIT, CommandResult, RunRequest

FETCH_TIMEOUT_S = 30.0
FETCH_SCRIPT = (
    "import base64,json,os,sys\n"
    "out={}\n"
    "for p in sys.argv[1:]:\n"
    "    if os.path.isfile(p):\n"
    "        with open(p,'rb') as f: out[p]=base64.b64encode(f.read()).decode()\n"
    "sys.stdout.write(json.dumps(out))\n"
)


@dataclass(frozen=True)
class StepConfig:
    """What shapes the actions besides the request: the node's per-action memory cap (MB) and
    the most cores a ``pytest`` run may get."""

    memory_cap_mb: int = 512
    pytest_max_cores: int = 4


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


def compile_action(request: RunRequest, language: Language, trajectory_id: str) -> Action:
    """The compile step of a compiled language; it carries the request's files."""
    assert language.compile is not None
    action_id = _new_id()
    source = language.source_name(action_id)
    command = f"{language.compile.format(src=source)}; s=$?; rm -f {source}; exit $s"
    return command_action(trajectory_id, command, id=action_id,
                          files={**request_files(request), source: request.code},
                          timeout_s=request.compile_timeout)


def run_action(
    request: RunRequest, language: Language, trajectory_id: str, config: StepConfig,
    signature: str = "", first: bool = True,
) -> Action:
    """The run step; ``first`` when no compile step carried the files before it."""
    action_id = _new_id()
    files = request_files(request) if first else {}
    extra: dict[str, Any] = {"id": action_id, "timeout_s": request.run_timeout}
    if request.stdin is not None:
        extra["payload"] = {"stdin": request.stdin}
    limit = _memory_limit(request, config)
    if language.name == "python" and limit is None:
        return code_action(trajectory_id, request.code, files=files, **extra)
    if language.compile is None:
        source = language.source_name(action_id)
        files[source] = request.code
        command = f"{language.run.format(src=source)}; s=$?; rm -f {source}; exit $s"
    else:
        command = language.run
    if limit is not None:
        command = f"ulimit -v {limit * 1024} 2>/dev/null; {command}"
    if language.elastic:
        cores = (1, max(config.pytest_max_cores, 1))
        return test_run_action(trajectory_id, command, cpu=cores, elasticity="linear",
                               signature=signature, files=files, **extra)
    return command_action(trajectory_id, command, files=files, **extra)


def fetch_action(request: RunRequest, trajectory_id: str) -> Action:
    """The fetch step: prints ``{path: base64}`` of the ``fetch_files`` that exist."""
    paths = " ".join(shlex.quote(p) for p in request.fetch_files)
    command = f"python3 -c {shlex.quote(FETCH_SCRIPT)} {paths}"
    return command_action(trajectory_id, command, timeout_s=FETCH_TIMEOUT_S)


def command_result(result: ActionResult) -> CommandResult:
    """An action's result as SandboxFusion's ``CommandRunResult``: ``Finished`` with the exit
    code when the command ran to its end, ``TimeLimitExceeded`` when it was killed at its
    timeout, ``Error`` when the sandbox could not run it (the reason in ``stderr``)."""
    output = result.output
    stdout, stderr = output.get("stdout"), output.get("stderr")
    took = result.timings.exec_s
    if result.status in ("ok", "failed"):
        code = output.get("exit_code")
        return CommandResult(FINISHED, took, None if code is None else int(code), stdout, stderr)
    if result.status == "timeout":
        return CommandResult(TIME_LIMIT, took, None, stdout, stderr)
    reason = result.error or f"the action ended with status {result.status!r}"
    return CommandResult(ERROR, None, None, stdout, f"tangram: {reason}")


def fetched_files(result: ActionResult) -> tuple[dict[str, str], str]:
    """The files the fetch step printed, and a message when some could not come back."""
    output = result.output
    if result.status != "ok":
        return {}, f"fetch_files failed: {result.error or output.get('stderr') or result.status}"
    if output.get("stdout_truncated"):
        return {}, ("fetch_files: the files are larger than the output cap "
                    "(TANGRAM_OUTPUT_CAP_BYTES); fetch fewer or smaller files")
    try:
        found = json.loads(output.get("stdout") or "{}")
    except ValueError:
        return {}, "fetch_files: the fetch step printed no JSON"
    if not isinstance(found, Mapping):
        return {}, "fetch_files: the fetch step printed no JSON object"
    return {str(k): str(v) for k, v in found.items()}, ""


def _memory_limit(request: RunRequest, config: StepConfig) -> int | None:
    """The request's memory limit (MB) when it is below the node's own per-action cap."""
    if 0 < request.memory_limit_mb < config.memory_cap_mb:
        return request.memory_limit_mb
    return None


def _new_id() -> str:
    return uuid.uuid4().hex
