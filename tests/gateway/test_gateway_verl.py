"""verl's own client against ``tangram gateway`` on a real stack: ``check_correctness`` from
``verl.utils.reward_score.sandbox_fusion`` (the installed verl package, not a copy) judges
correct and wrong output, a C++ compile error, a runtime error, a time-out, stdin ``None`` and
32 concurrent cases, each as verl expects from SandboxFusion."""

from __future__ import annotations

import pytest
from conftest import StartGateway
from verl.utils.reward_score.sandbox_fusion.utils import check_correctness

pytestmark = pytest.mark.slow

SUM = "a, b = map(int, input().split())\nprint(a + b)\n"
CPP_SUM = ("#include <iostream>\nint main() { long a, b; std::cin >> a >> b; "
           "std::cout << a + b << std::endl; return 0; }\n")


def judged(url: str, generation: str, inputs: list[str | None], outputs: list[str],
           language: str = "python", timeout: int = 10) -> list[object]:
    results, metadata = check_correctness(f"{url}/run_code", {"inputs": inputs,
                                                             "outputs": outputs},
                                          generation, timeout=timeout, language=language)
    assert all(m.get("api_request_error") is None for m in metadata), metadata
    return list(results)


def test_verls_check_correctness_judges_every_outcome(gateway: StartGateway) -> None:
    url = gateway()
    assert judged(url, SUM, ["1 2\n", "3 4\n"], ["3\n", "7\n"]) == [True, True]
    assert judged(url, SUM, ["1 2\n", "3 4\n"], ["3\n", "8\n"]) == [True, False]
    assert judged(url, CPP_SUM, ["20 22\n"], ["42\n"], language="cpp") == [True]
    broken = "#include <iostream>\nint main() { std::cout << missing; }\n"
    assert judged(url, broken, ["1\n", "2\n"], ["1\n", "2\n"], language="cpp") == [-4, -4]
    assert judged(url, "raise SystemExit(input())", ["boom\n"], ["boom\n"]) == [-2]
    assert judged(url, "int(input())\nprint(1 / 0)", ["7\n"], ["x\n"]) == [-2]
    assert judged(url, "while True:\n    pass\n", ["1\n"], ["1\n"], timeout=1) == [-3]
    assert judged(url, "print('no input read')", [None], ["no input read"]) == [True]
    reads_nothing = "import sys\nprint(repr(sys.stdin.read()))"
    assert judged(url, reads_nothing, [None], ["''"]) == [True]


def test_verls_check_correctness_with_32_concurrent_cases(gateway: StartGateway) -> None:
    url = gateway()
    square = "n = int(input())\nprint(n * n)\n"
    inputs: list[str | None] = [f"{n}\n" for n in range(32)]
    outputs = [f"{n * n}\n" for n in range(32)]
    outputs[5] = "not 25\n"
    expected: list[object] = [True] * 32
    expected[5] = False
    assert judged(url, square, inputs, outputs, timeout=30) == expected
