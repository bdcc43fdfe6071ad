"""``tangram bench malleable`` measures a suite with real pytest processes and prints its row;
without suites it says how to fetch them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tangram_bench.malleable import COLUMNS, section_text, table_of

ROOT = Path(__file__).resolve().parents[2]


def bench(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = f"import sys\nfrom tangram_celery.cli import main\nsys.exit(main({list(argv)!r}))"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, check=False, env=env)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPU cores")
def test_a_suite_gets_its_row(tmp_path: Path) -> None:
    suite = tmp_path / "suites" / "tiny-1.0"
    suite.mkdir(parents=True)
    (suite / "test_tiny.py").write_text(
        "import pytest\n@pytest.mark.parametrize('i', range(6))\ndef test_t(i): pass\n")
    done = bench("bench", "malleable", "--suites", str(tmp_path / "suites"), "--repeat", "1",
                 "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["rows"]
    assert [row["suite"] for row in rows] == ["tiny-1.0"]
    assert rows[0]["tests"].startswith("6 passed")
    assert all(rows[0][name] > 0 for name in COLUMNS[2:-2])
    assert all(rows[0][name] == "-" or rows[0][name] >= 0 for name in COLUMNS[-2:])
    assert table_of(rows).splitlines()[2].startswith("| tiny-1.0 | 6 passed")


def test_without_suites_it_names_the_set_up(tmp_path: Path) -> None:
    done = bench("bench", "malleable", "--suites", str(tmp_path / "none"))
    assert done.returncode == 1
    assert "bash scripts/run.sh setup" in done.stderr


def test_the_section_holds_every_row_and_the_spans() -> None:
    rows = [{c: "-" for c in COLUMNS} | {"suite": "a", "worker_start_s": 0.5, "retire_s": 0.001,
                                         "exit_s": 0.7},
            {c: "-" for c in COLUMNS} | {"suite": "b", "worker_start_s": 1.0, "retire_s": 0.003,
                                         "exit_s": 1.2}]
    text = section_text(rows, 3, 0.25, "tangram bench malleable --out docs")
    assert text.startswith("## malleable-suites\n\nCommand: `tangram bench malleable --out docs`")
    assert "| a | - | - | - | 0.5 |" in text and "| b | - | - | - | 1.0 |" in text
    assert "(the grow cost): 0.5-1.0 s over the suites" in text
    assert "last test: 0.001-0.003 s; its exit after that: 0.7-1.2 s" in text
    assert "load average at the end: 0.25" in text
