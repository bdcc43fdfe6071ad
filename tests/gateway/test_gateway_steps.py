"""What a request becomes (its actions) and what their results mean, as plain data."""

from __future__ import annotations

import pytest

from tangram_celery.action import ActionResult, Timings
from tangram_celery.errors import ConfigError, GatewayRequestError
from tangram_celery.gateway import check_exposure
from tangram_celery.gateway.languages import LANGUAGES
from tangram_celery.gateway.protocol import RunRequest
from tangram_celery.gateway.service import trajectory_for
from tangram_celery.gateway.steps import (
    StepConfig,
    command_result,
    compile_action,
    fetch_action,
    fetched_files,
    pytest_signature,
    run_action,
)

CONFIG = StepConfig(memory_cap_mb=512, pytest_max_cores=4)


def result(status: str, exit_code: int | None = 0, stdout: str = "", error: str = "",
           **output: object) -> ActionResult:
    return ActionResult("a", "t", "exec", status, {"exit_code": exit_code, "stdout": stdout,
                                                   "stderr": "e", **output},
                        node="node-0", timings=Timings(exec_s=0.25), error=error)


def test_python_runs_as_a_code_action_with_stdin_and_timeout() -> None:
    request = RunRequest("print(input())", "python", stdin="x", run_timeout=3)
    action = run_action(request, LANGUAGES["python"], "gw-1", CONFIG)
    assert (action.kind, action.payload["code"], action.payload["stdin"], action.timeout_s) == \
        ("exec", "print(input())", "x", 3.0)
    assert action.trajectory_id == "gw-1" and action.units().min == 1


def test_a_memory_limit_below_the_nodes_cap_is_an_address_space_limit() -> None:
    request = RunRequest("print(1)", "python", memory_limit_mb=256)
    action = run_action(request, LANGUAGES["python"], "gw-1", CONFIG)
    assert action.payload["cmd"].startswith(f"ulimit -v {256 * 1024} ")
    above = run_action(RunRequest("x", "python", memory_limit_mb=1024), LANGUAGES["python"],
                       "gw-1", CONFIG)
    assert "code" in above.payload


def test_cpp_compiles_then_runs_and_only_the_first_step_carries_files() -> None:
    request = RunRequest("int main(){}", "cpp", files={"in.txt": b"\xff1"}, compile_timeout=7)
    compiled = compile_action(request, LANGUAGES["cpp"], "gw-1")
    source = next(p for p in compiled.payload["files"] if p.endswith(".cpp"))
    assert compiled.payload["files"][source] == "int main(){}"
    assert compiled.payload["files"]["in.txt"].encode("utf-8", "surrogateescape") == b"\xff1"
    assert compiled.payload["cmd"].startswith(f"g++ -std=c++17 {source} -o test")
    assert compiled.timeout_s == 7.0
    ran = run_action(request, LANGUAGES["cpp"], "gw-1", CONFIG, first=False)
    assert ran.payload["cmd"] == "./test" and not ran.payload.get("files")


def test_pytest_is_an_elastic_test_run_keyed_by_its_signature() -> None:
    request = RunRequest("def test_a(): pass", "pytest", files={"lib.py": b"x = 1"})
    action = run_action(request, LANGUAGES["pytest"], "gw-1", CONFIG, "sig-1")
    assert action.kind == "test_run" and action.signature == "sig-1"
    assert (action.units().min, action.units().max) == (1, 4)
    assert action.elasticity is not None and "pytest" in action.payload["cmd"]


def test_signature_header_then_field_then_file_hash() -> None:
    request = RunRequest("code", "pytest", files={"a.py": b"1"}, signature="field")
    assert pytest_signature(request, "header") == "header"
    assert pytest_signature(request, None) == "field"
    one = pytest_signature(RunRequest("x", "pytest", files={"a.py": b"1"}), None)
    other = pytest_signature(RunRequest("y", "pytest", files={"a.py": b"1"}), None)
    changed = pytest_signature(RunRequest("x", "pytest", files={"a.py": b"2"}), None)
    assert one == other != changed and one.startswith("files-")


def test_fetch_step_names_the_files() -> None:
    action = fetch_action(RunRequest("", "bash", fetch_files=("out dir/a.txt",)), "gw-1")
    assert "'out dir/a.txt'" in action.payload["cmd"]


def test_results_become_command_results() -> None:
    assert command_result(result("ok")).to_json() == {
        "status": "Finished", "execution_time": 0.25, "return_code": 0, "stdout": "",
        "stderr": "e"}
    assert command_result(result("failed", 139)).return_code == 139
    timed_out = command_result(result("timeout", None))
    assert (timed_out.status, timed_out.return_code) == ("TimeLimitExceeded", None)
    broken = command_result(result("error", None, error="bwrap missing"))
    assert broken.status == "Error" and "bwrap missing" in (broken.stderr or "")
    assert command_result(result("rejected", None)).status == "Error"


def test_fetched_files_and_their_failures() -> None:
    assert fetched_files(result("ok", stdout='{"a": "eA=="}')) == ({"a": "eA=="}, "")
    assert "output cap" in fetched_files(result("ok", stdout="{", stdout_truncated=True))[1]
    assert "no JSON" in fetched_files(result("ok", stdout="nope"))[1]
    assert fetched_files(result("failed", 1))[0] == {}


def test_trajectory_names() -> None:
    fresh, kept = trajectory_for(None)
    assert fresh.startswith("gw-") and not kept
    assert trajectory_for("chat-7") == ("gw:chat-7", True)
    for bad in ("", "a b", "x" * 200, "é"):
        with pytest.raises(GatewayRequestError, match="X-Tangram-Trajectory"):
            trajectory_for(bad)


def test_off_loopback_needs_a_token() -> None:
    check_exposure("127.0.0.1", "")
    check_exposure("::1", "")
    check_exposure("0.0.0.0", "secret")
    for address in ("0.0.0.0", "10.1.2.3", "example.org"):
        with pytest.raises(ConfigError, match="TANGRAM_GATEWAY_TOKEN"):
            check_exposure(address, "")
