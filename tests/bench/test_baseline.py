"""The benchmarks' baseline server answers SandboxFusion's /run_code as SandboxFusion does."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tangram_bench.baseline import BaselineServer, run_code, start_baseline


@pytest.fixture(scope="module")
def baseline() -> Iterator[BaselineServer]:
    with start_baseline() as server:
        yield server


@pytest.mark.parametrize(("request_body", "status", "run_status", "stdout"), [
    ({"code": "print(input())", "language": "python", "stdin": "hi\n"}, "Success", "Finished",
     "hi\n"),
    ({"code": "import sys; sys.exit(3)", "language": "python"}, "Failed", "Finished", ""),
    ({"code": "echo $((2+3))", "language": "bash"}, "Success", "Finished", "5\n"),
    ({"code": "import time; time.sleep(5)", "language": "python", "run_timeout": 0.3},
     "Failed", "TimeLimitExceeded", ""),
    ({"code": "#include <cstdio>\nint main(){std::puts(\"c\");}", "language": "cpp"},
     "Success", "Finished", "c\n"),
])
def test_run_code(baseline: BaselineServer, request_body: dict[str, object], status: str,
                  run_status: str, stdout: str) -> None:
    answer = run_code(baseline.url, request_body)
    assert answer["status"] == status
    assert answer["run_result"]["status"] == run_status
    assert answer["run_result"]["stdout"] == stdout


def test_compile_error_and_unknown_language(baseline: BaselineServer) -> None:
    broken = run_code(baseline.url, {"code": "int main( {", "language": "cpp"})
    assert broken["status"] == "Failed"
    assert broken["run_result"] is None
    assert broken["compile_result"]["return_code"] != 0
    unknown = run_code(baseline.url, {"code": "x", "language": "cobol"})
    assert unknown["status"] == "SandboxError"
    assert "python" in unknown["message"]
