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
    command_results,
    fetched,
    pytest_signature,
    request_action,
)

CONFIG = StepConfig(memory_default_mb=512, pytest_max_cores=4)


def result(status: str, error: str = "", **output: object) -> ActionResult:
    return ActionResult("a", "t", "exec", status, dict(output), node="node-0",
                        timings=Timings(exec_s=0.25), error=error)


def step(exit_code: int | None = 0, stdout: str = "", **more: object) -> dict[str, object]:
    return {"exit_code": exit_code, "stdout": stdout, "stderr": "e", "exec_s": 0.25,
            "timed_out": False, "oom_killed": False, **more}


def test_a_python_request_is_one_ephemeral_action_in_the_warm_interpreter() -> None:
    request = RunRequest("print(input())", "python", stdin="x", run_timeout=3)
    action = request_action(request, LANGUAGES["python"], "gw-1", CONFIG)
    assert action.kind == "exec" and action.ephemeral and action.trajectory_id == "gw-1"
    assert action.payload["steps"] == [{"code": "print(input())", "stdin": "x",
                                        "timeout_s": 3.0}]
    kept = request_action(request, LANGUAGES["python"], "gw:chat", CONFIG, ephemeral=False)
    assert not kept.ephemeral


def test_the_memory_limit_is_honoured_and_reserved_never_lowered() -> None:
    for asked, given in ((256, 256), (1024, 1024), (-1, 512)):
        action = request_action(RunRequest("x", "python", memory_limit_mb=asked),
                                LANGUAGES["python"], "gw-1", CONFIG)
        assert action.payload["memory_mb"] == given == action.trajectory_memory_mb
        assert action.payload["env"]["TANGRAM_MEMORY_MB"] == str(given)


def test_cpp_compiles_then_runs_in_one_action_with_its_files_and_ssl() -> None:
    request = RunRequest("int main(){}", "cpp", files={"in.txt": b"\xff1"}, compile_timeout=7,
                         fetch_files=("out.txt",))
    action = request_action(request, LANGUAGES["cpp"], "gw-1", CONFIG)
    compile_step, run_step = action.payload["steps"]
    source = next(p for p in action.payload["files"] if p.endswith(".cpp"))
    assert action.payload["files"][source] == "int main(){}"
    assert action.payload["files"]["in.txt"].encode("utf-8", "surrogateescape") == b"\xff1"
    assert compile_step == {"cmd": f"g++ -std=c++17 {source} -o test -lssl -lcrypto "
                                   "-lpthread", "timeout_s": 7.0}
    assert run_step == {"cmd": "./test", "timeout_s": 10.0}
    assert action.payload["fetch"] == ["out.txt"]


def test_pytest_is_an_elastic_test_run_keyed_by_its_signature() -> None:
    request = RunRequest("def test_a(): pass", "pytest", files={"lib.py": b"x = 1"})
    action = request_action(request, LANGUAGES["pytest"], "gw-1", CONFIG, "sig-1")
    assert action.kind == "test_run" and action.signature == "sig-1"
    assert (action.units().min, action.units().max) == (1, 4)
    assert action.elasticity is not None and "pytest" in action.payload["steps"][0]["cmd"]


def test_signature_header_then_field_then_file_hash() -> None:
    request = RunRequest("code", "pytest", files={"a.py": b"1"}, signature="field")
    assert pytest_signature(request, "header") == "header"
    assert pytest_signature(request, None) == "field"
    one = pytest_signature(RunRequest("x", "pytest", files={"a.py": b"1"}), None)
    other = pytest_signature(RunRequest("y", "pytest", files={"a.py": b"1"}), None)
    changed = pytest_signature(RunRequest("x", "pytest", files={"a.py": b"2"}), None)
    assert one == other != changed and one.startswith("files-")


def test_results_become_command_results() -> None:
    compiled, ran = command_results(result("ok", steps=[step(), step(stdout="7")]), True)
    assert compiled is not None and ran is not None
    assert ran.to_json() == {"status": "Finished", "execution_time": 0.25, "return_code": 0,
                             "stdout": "7", "stderr": "e"}
    compiled, ran = command_results(result("failed", steps=[step(1)]), True)
    assert compiled is not None and compiled.return_code == 1 and ran is None
    _, timed_out = command_results(result("timeout", steps=[step(None, timed_out=True)]),
                                   False)
    assert timed_out is not None and timed_out.status == "TimeLimitExceeded"
    _, killed = command_results(result("failed", steps=[step(137, oom_killed=True)]), False,
                                256)
    assert killed is not None and "out of memory" in (killed.stderr or "")
    assert "256 MB" in (killed.stderr or "")
    _, broken = command_results(result("error", error="bwrap missing"), False)
    assert broken is not None and broken.status == "Error"
    assert "bwrap missing" in (broken.stderr or "")
    assert command_results(result("rejected"), True)[0] is not None


def test_fetched_files_and_their_failures() -> None:
    assert fetched(result("ok", files={"a": "eA=="})) == ({"a": "eA=="}, "")
    assert fetched(result("ok", files={}, fetch_error="too big")) == ({}, "too big")
    assert fetched(result("failed")) == ({}, "")


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
