"""How a solution is judged, as plain data: its code, its test plan, and the score of the results.

A solution's tests are either a pytest file (run as one elastic test run) or stdin/stdout cases in
verl's SandboxFusion form ``{"inputs": [...], "outputs": [...]}`` (one code action per case).
Nothing here does I/O: :mod:`.scoring` runs the plans and hands the outcomes back here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tangram_celery.errors import ValidationError

SOLUTION_FILE = "solution.py"
TESTS_FILE = "test_solution.py"
PYTEST_ARGS = ("-m", "pytest", "-q", "-p", "no:cacheprovider", TESTS_FILE)
PYTEST_COMMAND = "python3 " + " ".join(PYTEST_ARGS)
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)
_COUNT = re.compile(r"(\d+) (passed|failed|errors?)\b")


@dataclass(frozen=True)
class StdioCase:
    """One stdin/stdout case: the program reads ``stdin`` and must print ``expected``."""

    stdin: str
    expected: str


@dataclass(frozen=True)
class TestPlan:
    """How one solution is judged: by a pytest file, or by stdin/stdout cases."""

    __test__ = False

    solution: str
    pytest_file: str | None = None
    cases: tuple[StdioCase, ...] = ()

    def files(self) -> dict[str, str]:
        """The files of the pytest run: the solution as ``solution.py`` next to the tests."""
        return {SOLUTION_FILE: self.solution, TESTS_FILE: self.pytest_file or ""}


@dataclass(frozen=True)
class Score:
    """A solution's reward: the fraction of its tests that passed."""

    passed: int
    total: int

    @property
    def score(self) -> float:
        """``passed / total``, 0.0 for a plan without tests."""
        return self.passed / self.total if self.total else 0.0

    def as_dict(self) -> dict[str, float]:
        """The form verl's reward managers log: ``score`` plus extra columns."""
        return {"score": self.score, "passed": float(self.passed), "total": float(self.total)}


def completion_text(completion: Any) -> str:
    """The text of a completion: a string, or a conversation whose last message has ``content``."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], Mapping):
        return str(completion[-1].get("content", ""))
    raise ValidationError("completion", f"expected a string or a list of messages, got "
                          f"{type(completion).__name__}")


def extract_code(text: str) -> str:
    """The program in a model's answer: its last fenced code block, else the whole text."""
    blocks = _FENCE.findall(text)
    return str(blocks[-1]) if blocks else text


def plan_for(solution: str, tests: Any) -> TestPlan:
    """The test plan for ``solution`` given its tests: a pytest file (a string), or stdin/stdout
    cases (a mapping, or its JSON string, with equally long ``inputs`` and ``outputs``)."""
    if isinstance(tests, str):
        decoded = _json_cases(tests)
        if decoded is None:
            if not tests.strip():
                raise ValidationError("tests", "empty: give a pytest file or stdin/stdout cases")
            return TestPlan(solution, pytest_file=tests)
        tests = decoded
    if not isinstance(tests, Mapping):
        raise ValidationError("tests", "expected a pytest file (str) or a mapping with 'inputs' "
                              f"and 'outputs', got {type(tests).__name__}")
    inputs, outputs = tests.get("inputs"), tests.get("outputs")
    if not isinstance(inputs, Sequence) or not isinstance(outputs, Sequence) \
            or isinstance(inputs, str) or len(inputs) != len(outputs) or not inputs:
        raise ValidationError("tests", "'inputs' and 'outputs' must be non-empty lists of the "
                              "same length")
    cases = tuple(StdioCase(_text(i), _text(o)) for i, o in zip(inputs, outputs, strict=True))
    return TestPlan(solution, cases=cases)


def pytest_counts(stdout: str, exited_zero: bool) -> tuple[int, int]:
    """``(passed, total)`` from pytest's summary line; without one, the exit status alone."""
    counts = {"passed": 0, "failed": 0, "errors": 0}
    for number, word in _COUNT.findall(stdout):
        counts["errors" if word.startswith("error") else word] += int(number)
    total = sum(counts.values())
    if total == 0:
        return (1, 1) if exited_zero else (0, 1)
    return counts["passed"], total


def case_passed(exited_zero: bool, stdout: str, case: StdioCase) -> bool:
    """A case passes when the program exits 0 and prints the expected text (ends trimmed)."""
    return exited_zero and stdout.strip() == case.expected.strip()


def _json_cases(text: str) -> Mapping[str, Any] | None:
    if not text.lstrip().startswith("{"):
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, Mapping) and "inputs" in value else None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)
