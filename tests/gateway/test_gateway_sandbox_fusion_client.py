"""SandboxFusion's own PyPI client (``sandbox-fusion``) against ``tangram gateway`` on a real
stack: its models parse every answer, with the token given as the base URL's credentials (the
client takes only an endpoint)."""

from __future__ import annotations

import pytest
from conftest import StartGateway
from sandbox_fusion import RunCodeRequest, run_code

pytestmark = pytest.mark.slow


def test_sandbox_fusions_client_runs_code_through_the_gateway(gateway: StartGateway) -> None:
    url = gateway(token="tok3n")
    endpoint = url.replace("http://", "http://tangram:tok3n@")
    ok = run_code(RunCodeRequest(code="print(input()[::-1])", language="python", stdin="abc"),
                  endpoint=endpoint)
    assert ok.status.value == "Success" and ok.run_result.stdout == "cba\n"
    cpp = run_code(RunCodeRequest(code='#include <cstdio>\nint main() { puts("hi"); }',
                                  language="cpp"), endpoint=endpoint)
    assert cpp.status.value == "Success" and cpp.compile_result.return_code == 0
    assert cpp.run_result.stdout == "hi\n"
    failed = run_code(RunCodeRequest(code="raise SystemExit(3)", language="python"),
                      endpoint=endpoint)
    assert failed.status.value == "Failed" and failed.run_result.return_code == 3
    slow = run_code(RunCodeRequest(code="while True: pass", language="python", run_timeout=1),
                    endpoint=endpoint)
    assert slow.run_result.status.value == "TimeLimitExceeded"
    files = run_code(RunCodeRequest(code="open('o', 'w').write(open('i').read() * 2)",
                                    language="python", files={"i": "eHk="}, fetch_files=["o"]),
                     endpoint=endpoint)
    assert files.files == {"o": "eHl4eQ=="}
