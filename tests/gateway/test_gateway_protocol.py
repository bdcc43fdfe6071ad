"""SandboxFusion's request, response and status rules as plain-data tables."""

from __future__ import annotations

import base64
import json

import pytest

from tangram_celery.errors import GatewayRequestError
from tangram_celery.gateway.languages import LANGUAGES, available, unsupported
from tangram_celery.gateway.protocol import (
    CommandResult,
    parse_run_request,
    response_body,
    run_status,
    sandbox_error,
)

OK = CommandResult("Finished", 0.1, 0, "out", "")
EXIT_1 = CommandResult("Finished", 0.1, 1, "", "boom")
TLE = CommandResult("TimeLimitExceeded", 1.0, None, "", "")
BROKEN = CommandResult("Error", None, None, None, "tangram: sandbox setup failed")


def test_defaults_are_sandboxfusions() -> None:
    request = parse_run_request(json.dumps({"code": "print(1)", "language": "python"}))
    assert (request.stdin, request.compile_timeout, request.run_timeout,
            request.memory_limit_mb, dict(request.files), request.fetch_files) == \
        (None, 10.0, 10.0, -1, {}, ())


def test_verls_payload_parses() -> None:
    body = {"compile_timeout": 10, "run_timeout": 10, "code": "x", "stdin": None,
            "memory_limit_MB": 1024, "language": "cpp", "files": {}, "fetch_files": []}
    request = parse_run_request(json.dumps(body).encode())
    assert (request.language, request.memory_limit_mb, request.stdin) == ("cpp", 1024, None)


def test_files_are_base64_and_skipped_like_sandboxfusion() -> None:
    files = {"a.bin": base64.b64encode(b"\x00\xff").decode(), "b": None,
             "IGNORE_THIS_FILE.txt": base64.b64encode(b"x").decode()}
    request = parse_run_request(json.dumps({"code": "", "language": "bash", "files": files}))
    assert dict(request.files) == {"a.bin": b"\x00\xff"}


def test_numbers_as_strings_and_base64_with_line_breaks_read_as_sandboxfusion_reads_them(
        ) -> None:
    wrapped = base64.encodebytes(bytes(range(200))).decode()
    assert "\n" in wrapped
    request = parse_run_request(json.dumps({
        "code": "x", "language": "python", "run_timeout": "2.5", "compile_timeout": " 3 ",
        "memory_limit_MB": "1024", "files": {"a.bin": wrapped}}))
    assert (request.run_timeout, request.compile_timeout, request.memory_limit_mb) == \
        (2.5, 3.0, 1024)
    assert request.files["a.bin"] == bytes(range(200))


@pytest.mark.parametrize(("body", "field"), [
    ("not json", "body"),
    ("[1]", "body"),
    ({"language": "python"}, "code"),
    ({"code": "x"}, "language"),
    ({"code": "x", "language": "python", "stdin": 3}, "stdin"),
    ({"code": "x", "language": "python", "run_timeout": -1}, "run_timeout"),
    ({"code": "x", "language": "python", "compile_timeout": "nine"}, "compile_timeout"),
    ({"code": "x", "language": "cobol"}, "language"),
    ({"code": "x", "language": "python", "memory_limit_MB": 1.5}, "memory_limit_MB"),
    ({"code": "x", "language": "python", "files": {"a": "abc"}}, "files.a"),
    ({"code": "x", "language": "python", "files": {"../a": "eA=="}}, "files.../a"),
    ({"code": "x", "language": "python", "files": ["a"]}, "files"),
    ({"code": "x", "language": "python", "fetch_files": "a"}, "fetch_files"),
    ({"code": "x", "language": "python", "fetch_files": ["/etc/passwd"]},
     "fetch_files./etc/passwd"),
])
def test_bad_requests_name_their_field(body: object, field: str) -> None:
    raw = body if isinstance(body, str) else json.dumps(body)
    with pytest.raises(GatewayRequestError) as caught:
        parse_run_request(raw)
    assert caught.value.field == field
    assert field in str(caught.value)


@pytest.mark.parametrize(("compiled", "ran", "status", "message"), [
    (None, OK, "Success", ""),
    (None, EXIT_1, "Failed", ""),
    (None, TLE, "Failed", ""),
    (EXIT_1, None, "Failed", ""),
    (TLE, None, "Failed", ""),
    (OK, OK, "Success", ""),
    (OK, EXIT_1, "Failed", ""),
    (None, BROKEN, "SandboxError", "tangram: sandbox setup failed"),
    (BROKEN, None, "SandboxError", "tangram: sandbox setup failed"),
    (OK, BROKEN, "SandboxError", "tangram: sandbox setup failed"),
])
def test_status_rules(compiled: CommandResult | None, ran: CommandResult | None, status: str,
                      message: str) -> None:
    assert run_status(compiled, ran) == (status, message)


def test_response_has_sandboxfusions_fields() -> None:
    body = response_body(None, OK, {"f": "eA=="}, "node-0")
    assert set(body) == {"status", "message", "compile_result", "run_result",
                         "executor_pod_name", "files"}
    assert body["run_result"] == {"status": "Finished", "execution_time": 0.1, "return_code": 0,
                                  "stdout": "out", "stderr": ""}
    assert body["compile_result"] is None and body["files"] == {"f": "eA=="}
    assert sandbox_error("no")["status"] == "SandboxError"


def test_languages_follow_the_tools_found() -> None:
    assert available(lambda tool: tool in {"python3", "bash"}) == ("python", "pytest", "bash")
    assert available(lambda tool: False, ["cpp"]) == ("cpp",)
    assert "cpp" in LANGUAGES and LANGUAGES["cpp"].compile is not None
    message = unsupported("cobol", ("python", "cpp"))
    assert "cobol" in message and "python, cpp" in message


def test_unknown_configured_language_is_refused() -> None:
    from tangram_celery.errors import ConfigError

    with pytest.raises(ConfigError, match="cobol"):
        available(lambda tool: True, ["python", "cobol"])
