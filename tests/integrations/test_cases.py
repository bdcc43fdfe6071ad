"""How solutions are judged, as plain data: code extraction, test plans, pytest counts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tangram_celery.errors import ValidationError
from tangram_celery.integrations.cases import (
    StdioCase,
    TestPlan,
    case_passed,
    completion_text,
    extract_code,
    plan_for,
    pytest_counts,
)
from tangram_celery.integrations.scoring import RewardOptions


@pytest.mark.parametrize(("text", "code"), [
    ("x = 1\n", "x = 1\n"),
    ("Here:\n```python\nx = 1\n```\ndone", "x = 1\n"),
    ("```py\na = 0\n```\nthen\n```\nb = 2\n```", "b = 2\n"),
])
def test_the_code_is_the_last_fenced_block_or_the_text(text: str, code: str) -> None:
    assert extract_code(text) == code


@pytest.mark.parametrize(("completion", "text"), [
    ("plain", "plain"),
    ([{"role": "assistant", "content": "x = 1"}], "x = 1"),
])
def test_completions_are_strings_or_conversations(completion: Any, text: str) -> None:
    assert completion_text(completion) == text


def test_a_completion_of_another_type_is_refused() -> None:
    with pytest.raises(ValidationError, match="completion"):
        completion_text(42)


@pytest.mark.parametrize(("tests", "plan"), [
    ("def test_a():\n    pass\n", TestPlan("s", pytest_file="def test_a():\n    pass\n")),
    ({"inputs": ["1\n", "2\n"], "outputs": ["1", "4"]},
     TestPlan("s", cases=(StdioCase("1\n", "1"), StdioCase("2\n", "4")))),
    (json.dumps({"inputs": ["3"], "outputs": [9]}), TestPlan("s", cases=(StdioCase("3", "9"),))),
])
def test_tests_are_a_pytest_file_or_stdio_cases(tests: Any, plan: TestPlan) -> None:
    assert plan_for("s", tests) == plan


@pytest.mark.parametrize("tests", [
    "", {"inputs": ["1"], "outputs": []}, {"inputs": [], "outputs": []}, 7,
    {"inputs": "1", "outputs": "1"},
])
def test_bad_tests_name_the_field(tests: Any) -> None:
    with pytest.raises(ValidationError, match="tests"):
        plan_for("s", tests)


@pytest.mark.parametrize(("stdout", "exited_zero", "counts"), [
    ("2 passed in 0.01s", True, (2, 2)),
    ("1 failed, 3 passed in 0.2s", False, (3, 4)),
    ("1 passed, 2 errors in 0.1s", False, (1, 3)),
    ("SyntaxError", False, (0, 1)),
    ("", True, (1, 1)),
])
def test_pytest_counts(stdout: str, exited_zero: bool, counts: tuple[int, int]) -> None:
    assert pytest_counts(stdout, exited_zero) == counts


@pytest.mark.parametrize(("exited_zero", "stdout", "passed"), [
    (True, "4\n", True), (True, "  4 ", True), (True, "5\n", False), (False, "4\n", False),
])
def test_a_case_passes_on_exit_zero_and_the_expected_text(exited_zero: bool, stdout: str,
                                                          passed: bool) -> None:
    assert case_passed(exited_zero, stdout, StdioCase("", "4")) is passed


@pytest.mark.parametrize(("values", "options"), [
    ({}, RewardOptions()),
    ({"cpu": 2, "timeout_s": 5, "type": "native"}, RewardOptions(cpu=(2, 2), timeout_s=5)),
    ({"cpu": [1, 4], "signature": "s"}, RewardOptions(cpu=(1, 4), signature="s")),
])
def test_options_from_a_trainer_config(values: dict[str, Any], options: RewardOptions) -> None:
    assert RewardOptions.from_mapping(values) == options


@pytest.mark.parametrize("values", [{"cpu": 0}, {"cpu": [3, 1]}, {"timeout_s": "soon"}])
def test_bad_options_name_the_field(values: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match=next(iter(values))):
        RewardOptions.from_mapping(values)
