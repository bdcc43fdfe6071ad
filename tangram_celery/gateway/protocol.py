"""SandboxFusion's ``/run_code`` as data: the request, the two command results, the response.

Pure: :func:`parse_run_request` checks a request body the way SandboxFusion's models do (same
fields, same defaults, numbers given as strings and base64 with line breaks read as pydantic and
Python's decoder read them) and raises :class:`~tangram_celery.errors.GatewayRequestError` naming
the field (the server answers 422 with FastAPI's ``detail``); :func:`run_status` applies
SandboxFusion's status rules; :func:`response_body` is the JSON a client reads back.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tangram_celery.errors import GatewayRequestError
from tangram_celery.gateway.languages import SANDBOX_FUSION_LANGUAGES

KNOWN_LANGUAGES = SANDBOX_FUSION_LANGUAGES | {"c"}
"""SandboxFusion's languages, and those tangram serves beyond them."""

FINISHED = "Finished"
TIME_LIMIT = "TimeLimitExceeded"
ERROR = "Error"
SUCCESS = "Success"
FAILED = "Failed"
SANDBOX_ERROR = "SandboxError"
DEFAULT_TIMEOUT_S = 10.0
"""SandboxFusion's default ``compile_timeout`` and ``run_timeout``."""
REQUEST_FIELDS = frozenset({
    "code", "language", "stdin", "compile_timeout", "run_timeout", "memory_limit_MB", "files",
    "fetch_files", "signature",
})
SKIPPED_FILE_MARK = "IGNORE_THIS_FILE"
"""SandboxFusion leaves out files whose name holds this mark (and files whose content is null)."""


@dataclass(frozen=True)
class RunRequest:
    """One ``POST /run_code`` body, checked. ``files`` holds the decoded bytes by path.

    ``signature`` is tangram's own optional field (the key of a ``pytest`` run's learned
    durations); SandboxFusion ignores unknown fields and so do its clients."""

    code: str
    language: str
    stdin: str | None = None
    compile_timeout: float = DEFAULT_TIMEOUT_S
    run_timeout: float = DEFAULT_TIMEOUT_S
    memory_limit_mb: int = -1
    files: Mapping[str, bytes] = field(default_factory=dict)
    fetch_files: tuple[str, ...] = ()
    signature: str = ""


@dataclass(frozen=True)
class CommandResult:
    """SandboxFusion's ``CommandRunResult``: one compile or run step."""

    status: str
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON form, every field present as SandboxFusion writes it."""
        return {"status": self.status, "execution_time": self.execution_time,
                "return_code": self.return_code, "stdout": self.stdout, "stderr": self.stderr}


def parse_run_request(body: bytes | str) -> RunRequest:
    """Parse and check a ``/run_code`` body; raises :class:`GatewayRequestError` naming the
    field."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise GatewayRequestError("body", f"not valid JSON ({exc}); send a JSON object with "
                                  "at least 'code' and 'language'") from None
    if not isinstance(data, Mapping):
        raise GatewayRequestError("body", f"expected a JSON object, got {type(data).__name__}")
    code = data.get("code")
    if not isinstance(code, str):
        raise GatewayRequestError("code", "missing or not a string; the program to run")
    language = data.get("language")
    if not isinstance(language, str) or language not in KNOWN_LANGUAGES:
        raise GatewayRequestError("language", f"missing or not one of SandboxFusion's languages "
                                  f"({', '.join(sorted(KNOWN_LANGUAGES))})")
    stdin = data.get("stdin")
    if stdin is not None and not isinstance(stdin, str):
        raise GatewayRequestError("stdin", "must be a string or null")
    signature = data.get("signature") or ""
    if not isinstance(signature, str) or len(signature) > 200:
        raise GatewayRequestError("signature", "must be a string of at most 200 characters")
    return RunRequest(
        code=code,
        language=language,
        stdin=stdin,
        compile_timeout=_timeout("compile_timeout", data.get("compile_timeout")),
        run_timeout=_timeout("run_timeout", data.get("run_timeout")),
        memory_limit_mb=_memory(data.get("memory_limit_MB")),
        files=_files(data.get("files")),
        fetch_files=_fetch_files(data.get("fetch_files")),
        signature=signature,
    )


def run_status(compile_result: CommandResult | None,
               run_result: CommandResult | None) -> tuple[str, str]:
    """SandboxFusion's rules: (status, message) of a response from its two steps.

    A step in ``Error`` (the sandbox failed) makes ``SandboxError`` with that step's stderr as
    the message; else a time-out or a non-zero exit makes ``Failed``; else ``Success``."""
    steps = [s for s in (compile_result, run_result) if s is not None]
    for step in steps:
        if step.status == ERROR:
            return SANDBOX_ERROR, step.stderr or ""
    if any(s.status == TIME_LIMIT for s in steps):
        return FAILED, ""
    if any(s.return_code not in (None, 0) for s in steps):
        return FAILED, ""
    return SUCCESS, ""


def response_body(
    compile_result: CommandResult | None, run_result: CommandResult | None,
    files: Mapping[str, str] | None = None, executor: str | None = None, message: str = "",
) -> dict[str, Any]:
    """The ``RunCodeResponse`` JSON; ``message`` (when given) replaces the rules' message."""
    status, found = run_status(compile_result, run_result)
    return {
        "status": status,
        "message": message or found,
        "compile_result": None if compile_result is None else compile_result.to_json(),
        "run_result": None if run_result is None else run_result.to_json(),
        "executor_pod_name": executor,
        "files": dict(files or {}),
    }


def sandbox_error(message: str, executor: str | None = None) -> dict[str, Any]:
    """A ``SandboxError`` response that ran nothing (an unsupported language, no CPU node)."""
    return {"status": SANDBOX_ERROR, "message": message, "compile_result": None,
            "run_result": None, "executor_pod_name": executor, "files": {}}


def _number(raw: Any) -> float | None:
    """A JSON number, or a string holding one (pydantic's lax reading); None otherwise."""
    if isinstance(raw, str):
        try:
            raw = float(raw.strip())
        except ValueError:
            return None
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        return None
    return float(raw)


def _timeout(name: str, raw: Any) -> float:
    if raw is None:
        return DEFAULT_TIMEOUT_S
    value = _number(raw)
    if value is None or value <= 0:
        raise GatewayRequestError(name, "must be a positive number of seconds")
    return value


def _memory(raw: Any) -> int:
    if raw is None:
        return -1
    value = _number(raw)
    if value is None or value != int(value):
        raise GatewayRequestError("memory_limit_MB", "must be a whole number of MB (-1: none)")
    return int(value)


def _files(raw: Any) -> dict[str, bytes]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise GatewayRequestError("files", "expected an object of path -> base64 content")
    files: dict[str, bytes] = {}
    for path, content in raw.items():
        if content is None or SKIPPED_FILE_MARK in path:
            continue
        if not isinstance(content, str):
            raise GatewayRequestError(f"files.{path}", "content must be base64 text or null")
        _check_path(f"files.{path}", path)
        try:
            files[path] = base64.b64decode(content)
        except (binascii.Error, ValueError):
            raise GatewayRequestError(f"files.{path}", "content is not valid base64") from None
    return files


def _fetch_files(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(p, str) for p in raw):
        raise GatewayRequestError("fetch_files", "expected a list of relative file paths")
    for path in raw:
        _check_path(f"fetch_files.{path}", path)
    return tuple(raw)


def _check_path(where: str, path: str) -> None:
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts or path.startswith("/") or ".." in parts or "\x00" in path:
        raise GatewayRequestError(where, "paths are relative to the work dir, without '..'")
