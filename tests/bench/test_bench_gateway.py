"""``tangram bench gateway``: its programs are right, its ratios and table on plain data, and one
small real run of both systems side by side."""

from __future__ import annotations

import subprocess

import pytest

from tangram_bench.gateway import (
    Point,
    cpp_programs,
    main,
    python_programs,
    ratios,
    render,
    section_text,
    verl_request,
)


def test_the_programs_print_their_expected_outputs() -> None:
    for code, cases in python_programs(3):
        for stdin, expected in cases:
            done = subprocess.run(["/usr/bin/python3", "-c", code], input=stdin, text=True,
                                  capture_output=True, timeout=30, check=True)
            assert done.stdout == expected
    assert len(cpp_programs(5)[0][1]) == 5


def test_requests_are_verls_payload() -> None:
    assert verl_request("x", "1\n", "python") == {
        "compile_timeout": 10, "run_timeout": 10, "code": "x", "stdin": "1\n",
        "memory_limit_MB": 1024, "language": "python", "files": {}, "fetch_files": []}


def test_ratios_and_table() -> None:
    points = [Point("baseline", 32, 100, 50.0, 200.0, 10.0, 0.5),
              Point("tangram", 32, 100, 25.0, 100.0, 25.0, 1.0,
                    {"client": 1, "gateway": 2, "broker": 3, "sandbox": 4, "program": 5}),
              Point("tangram", 8, 10, 1.0, 1.0, 1.0, 1.0)]
    assert ratios(points) == {32: {"throughput": 2.5, "p90": 0.5, "p50": 0.5,
                                   "correct_throughput": 5.0}}
    text = render(points, "python", 4)
    assert "32 clients: throughput 2.50x the baseline's, p50 0.50x, p90 0.50x, correct " \
           "answers per second 5.00x" in text
    assert " 8 clients" not in text
    assert "client 1.0, gateway 2.0, broker 3.0, sandbox 4.0, program 5.0" in text


def test_the_section_names_its_command_and_holds_every_point() -> None:
    points = [Point("baseline", 32, 100, 50.0, 200.0, 10.0, 0.5),
              Point("tangram", 32, 100, 25.0, 100.0, 25.0, 1.0,
                    {"client": 1, "gateway": 2, "broker": 3, "sandbox": 4, "program": 5}),
              Point("tangram", 1, 10, 5.0, 6.0, 2.0, 1.0,
                    {"client": 6, "gateway": 7, "broker": 8, "sandbox": 9, "program": 10})]
    text = section_text(points, "cpp", 4, "tangram bench gateway --language cpp --out docs",
                        "a test machine")
    assert text.startswith("## gateway-cpp\n\nCommand: `tangram bench gateway --language cpp "
                           "--out docs`\n")
    assert "| baseline | 32 | 100 | 50.0 | 200.0 | 10.0 | 50% |" in text
    assert "| 32 | 2.50x | 0.50x | 0.50x | 5.00x |" in text
    assert "at 1 client(s) (mean ms, from `X-Tangram-Timings`): client 6.0, gateway 7.0, " \
           "broker 8.0, sandbox 9.0, program 10.0." in text


def test_a_baseline_with_no_right_answer_is_named_not_divided_by() -> None:
    points = [Point("baseline", 8, 10, 1.0, 1.0, 1.0, 0.0),
              Point("tangram", 8, 10, 1.0, 1.0, 1.0, 1.0)]
    text = section_text(points, "cpp", 4, "tangram bench gateway --out docs", "a test machine")
    assert "| 8 | 1.00x | 1.00x | 1.00x | baseline judged none right |" in text
    assert "inf" not in text
    assert "correct answers per second baseline judged none right" in render(points, "cpp", 4)


def test_bad_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--clients", "a,b"]) == 2
    assert main(["--clients", "0"]) == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.slow
def test_a_small_run_measures_both_systems(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--clients", "1,2", "--programs", "2", "--cases", "2", "--json"]) == 0
    out = capsys.readouterr().out
    rows = [cells for cells in (line.split() for line in out.splitlines())
            if len(cells) == 7 and cells[0] in ("baseline", "tangram")]
    assert {(row[0], row[1]) for row in rows} == {
        ("baseline", "1"), ("tangram", "1"), ("baseline", "2"), ("tangram", "2")}
    assert all(row[-1] == "100%" for row in rows), out
    assert "2 clients: throughput" in out
