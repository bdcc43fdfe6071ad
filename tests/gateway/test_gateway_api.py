"""``tangram gateway`` on a real stack (Redis, a CPU node worker, the gateway process): the
SandboxFusion API end to end, its files, its trajectories, its errors and its guard, and a
burst that queues."""

from __future__ import annotations

import base64
import concurrent.futures
import subprocess
import sys
import time

import pytest
import redis
from conftest import NODE, StartGateway, call, run_code
from rich.console import Console

from tangram_celery import keys
from tangram_celery.observe.status import print_status
from tangram_celery.settings import Settings

CPP_DOUBLE = ("#include <iostream>\nint main() { long a; std::cin >> a; "
              "std::cout << 2 * a << std::endl; return 0; }\n")


def test_off_loopback_without_a_token_refuses_to_start() -> None:
    done = subprocess.run([sys.executable, "-m", "tangram_celery.gateway", "--address",
                           "0.0.0.0", "--port", "0"], capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin"}, check=False)
    assert done.returncode == 2
    assert "TANGRAM_GATEWAY_TOKEN" in done.stderr and "0.0.0.0" in done.stderr


@pytest.mark.slow
def test_status_rules_match_sandboxfusion(gateway: StartGateway) -> None:
    url = gateway()
    cases = {
        "ok": dict(code="print(input() * 2)", language="python", stdin="ab"),
        "no_stdin": dict(code="import sys; print(repr(sys.stdin.read()))", language="python"),
        "exit": dict(code="import sys; print('x'); sys.exit(3)", language="python"),
        "raise": dict(code="raise ValueError('boom')", language="python"),
        "loop": dict(code="while True: pass", language="python", run_timeout=1),
        "cpp": dict(code=CPP_DOUBLE, language="cpp", stdin="21"),
        "cpp_error": dict(code="int main() { return undefined_name; }", language="cpp"),
        "bash": dict(code="echo out; echo err >&2; exit 4", language="bash"),
        "memory": dict(code="b = bytearray(300 * 1024 * 1024)", language="python",
                       memory_limit_MB=128),
        "big": dict(code="b = bytearray(700 * 1024 * 1024); print(len(b) >> 20)",
                    language="python", memory_limit_MB=1024),
        "huge": dict(code="print(1)", language="python", memory_limit_MB=10 ** 7),
        "julia": dict(code="println(1)", language="julia"),
        "fetch_failed": dict(code="open('o.txt', 'w').write('x'); raise SystemExit(2)",
                             language="python", fetch_files=["o.txt"]),
    }
    with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
        answers = dict(zip(cases, pool.map(lambda c: run_code(url, **c), cases.values()),
                           strict=True))
    ok = answers["ok"]
    assert (ok["status"], ok["message"], ok["compile_result"]) == ("Success", "", None)
    assert ok["run_result"]["status"] == "Finished" and ok["run_result"]["stdout"] == "abab\n"
    assert ok["run_result"]["return_code"] == 0 and ok["run_result"]["execution_time"] > 0
    assert ok["executor_pod_name"] == NODE and ok["files"] == {}
    assert answers["no_stdin"]["run_result"]["stdout"] == "''\n"
    for name, code in (("exit", 3), ("raise", 1), ("bash", 4)):
        assert answers[name]["status"] == "Failed", name
        assert answers[name]["run_result"]["status"] == "Finished", name
        assert answers[name]["run_result"]["return_code"] == code, name
    assert "ValueError: boom" in answers["raise"]["run_result"]["stderr"]
    assert answers["bash"]["run_result"]["stdout"] == "out\n"
    assert answers["bash"]["run_result"]["stderr"] == "err\n"
    loop = answers["loop"]
    assert loop["status"] == "Failed" and loop["run_result"]["status"] == "TimeLimitExceeded"
    assert loop["run_result"]["return_code"] is None
    cpp = answers["cpp"]
    assert cpp["status"] == "Success" and cpp["run_result"]["stdout"] == "42\n"
    assert cpp["compile_result"]["status"] == "Finished"
    assert cpp["compile_result"]["return_code"] == 0
    broken = answers["cpp_error"]
    assert broken["status"] == "Failed" and broken["run_result"] is None
    assert broken["compile_result"]["return_code"] != 0
    assert "undefined_name" in broken["compile_result"]["stderr"]
    assert answers["memory"]["status"] == "Failed"
    assert "MemoryError" in answers["memory"]["run_result"]["stderr"]
    assert answers["big"]["status"] == "Success", answers["big"]
    assert answers["big"]["run_result"]["stdout"] == "700\n"
    huge = answers["huge"]
    assert huge["status"] == "SandboxError" and "memory" in huge["message"], huge
    julia = answers["julia"]
    assert julia["status"] == "SandboxError" and "julia" in julia["message"]
    assert "python" in julia["message"] and "cpp" in julia["message"]
    failed = answers["fetch_failed"]
    assert failed["status"] == "Failed" and base64.b64decode(failed["files"]["o.txt"]) == b"x"


@pytest.mark.slow
def test_files_in_fetch_files_out_and_a_named_trajectory_keeps_them(
        gateway: StartGateway) -> None:
    url = gateway()
    blob = bytes(range(256))
    answer = run_code(
        url, code="data = open('in/blob.bin', 'rb').read()\n"
                  "open('out.bin', 'wb').write(data[::-1])\nprint(len(data))",
        language="python", files={"in/blob.bin": base64.b64encode(blob).decode()},
        fetch_files=["out.bin", "missing.txt"])
    assert answer["status"] == "Success", answer
    assert answer["run_result"]["stdout"] == "256\n"
    assert set(answer["files"]) == {"out.bin"}
    assert base64.b64decode(answer["files"]["out.bin"]) == blob[::-1]

    chat = {"X-Tangram-Trajectory": "chat-1"}
    run_code(url, chat, code="open('notes.txt', 'w').write('kept')", language="python")
    again = run_code(url, chat, code="print(open('notes.txt').read())", language="python")
    assert again["run_result"]["stdout"] == "kept\n", again
    fresh = run_code(url, code="import os; print(os.path.exists('notes.txt'))",
                     language="python")
    assert fresh["run_result"]["stdout"] == "False\n"
    notebook = {"X-Tangram-Trajectory": "nb-1", "X-Tangram-Session": "1"}
    run_code(url, notebook, code="import json\nstate = {'n': 1}", language="python")
    shown = run_code(url, notebook, code="state['n'] += 1\njson.dumps(state)",
                     language="python")
    assert shown["run_result"]["stdout"] == "'{\"n\": 2}'\n", shown
    status, refused = call(f"{url}/run_code", body={"code": "1", "language": "python"},
                           headers={"X-Tangram-Session": "1"})
    assert status == 422 and refused["field"] == "X-Tangram-Session"
    status, ended = call(f"{url}/v1/trajectories/chat-1", method="DELETE")
    assert (status, ended) == (200, {"ended": "gw:chat-1"})
    gone = run_code(url, chat, code="import os; print(os.path.exists('notes.txt'))",
                    language="python")
    assert gone["run_result"]["stdout"] == "False\n"


@pytest.mark.slow
def test_errors_token_ping_health_and_status(gateway: StartGateway, settings: Settings,
                                             redis_client: redis.Redis) -> None:
    url = gateway(token="s3cret")
    program = {"code": "print(1)", "language": "python"}
    assert call(f"{url}/v1/ping", "GET") == (200, "pong")  # the JSON string, decoded
    status, health = call(f"{url}/healthz", "GET")
    assert status == 200 and health["status"] == "ok" and "python" in health["languages"]
    status, refused = call(f"{url}/run_code", body=program)
    assert status == 401 and "TANGRAM_GATEWAY_TOKEN" in refused["error"]
    assert call(f"{url}/run_code", body=program,
                headers={"Authorization": "Bearer wrong"})[0] == 401
    assert call(f"{url}/v1/trajectories/x", "DELETE")[0] == 401
    good = {"Authorization": "Bearer s3cret"}
    assert run_code(url, good, **program)["status"] == "Success"
    status, by_query = call(f"{url}/run_code?token=s3cret", body=program)
    assert status == 200 and by_query["run_result"]["stdout"] == "1\n"

    status, bad = call(f"{url}/run_code", raw=b"{not json", headers=good)
    assert status == 422 and bad["field"] == "body" and "JSON" in bad["error"]
    status, bad = call(f"{url}/run_code", body={"language": "python"}, headers=good)
    assert status == 422 and bad["detail"][0]["loc"] == ["body", "code"]
    status, bad = call(f"{url}/run_code", body={"code": "x", "language": "cobol"},
                       headers=good)
    assert status == 422 and bad["detail"][0]["loc"] == ["body", "language"]
    status, bad = call(f"{url}/run_code", body=program,
                       headers={**good, "X-Tangram-Trajectory": "no spaces"})
    assert status == 422 and bad["field"] == "X-Tangram-Trajectory"
    status, missing = call(f"{url}/nope", "GET")
    assert status == 404 and "POST /run_code" in missing["served"]
    status, submit = call(f"{url}/submit", body={"dataset": "x"}, headers=good)
    assert status == 501 and "/submit" in submit["error"]

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and b'"served": 2' not in b"".join(
            redis_client.hvals(keys.GATEWAYS)):
        time.sleep(0.2)
    console = Console(record=True, width=200)
    print_status(settings, console, inspect_timeout_s=0)
    text = console.export_text()
    line = next(row for row in text.splitlines() if url in row)
    assert line.split()[-3:] == ["yes", "2", "0"], text


@pytest.mark.slow
def test_pytest_requests_are_elastic_test_runs(gateway: StartGateway,
                                               redis_client: redis.Redis) -> None:
    url = gateway()
    tests = "from lib import double\n\ndef test_double():\n    assert double(2) == 4\n"
    lib = base64.b64encode(b"def double(x):\n    return 2 * x\n").decode()
    answer = run_code(url, {"X-Tangram-Signature": "double-tests"}, code=tests,
                      language="pytest", files={"lib.py": lib})
    assert answer["status"] == "Success", answer
    assert "1 passed" in answer["run_result"]["stdout"]
    failing = run_code(url, code=tests.replace("== 4", "== 5"), language="pytest",
                       files={"lib.py": lib})
    assert failing["status"] == "Failed" and "1 failed" in failing["run_result"]["stdout"]
    kinds = [fields[b"kind"] for _, fields in redis_client.xrange(keys.METRICS_ACTS)]
    assert kinds.count(b"test_run") == 2


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_burst_of_256_requests_queues_and_never_answers_5xx(gateway: StartGateway) -> None:
    url = gateway()

    def one(index: int) -> tuple[int, dict[str, object]]:
        status, body = call(f"{url}/run_code", body={"code": f"print({index})",
                                                     "language": "python"}, timeout=800)
        return status, body

    with concurrent.futures.ThreadPoolExecutor(256) as pool:
        answers = list(pool.map(one, range(256)))
    assert [status for status, _ in answers] == [200] * 256
    for index, (_, body) in enumerate(answers):
        assert body["status"] == "Success", body
        assert body["run_result"]["stdout"] == f"{index}\n"  # type: ignore[index]
