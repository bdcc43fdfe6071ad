"""bandit runs clean on the package: every finding is either fixed or justified on its line
(``# nosec BXXX # reason``), and whole classes are skipped only in pyproject's ``[tool.bandit]``,
with their reasons there. Nothing is skipped silently."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (ROOT / "tangram_celery", ROOT / "tangram_bench")
PYPROJECT = ROOT / "pyproject.toml"
JUSTIFIED_SKIPS = {"B101", "B311", "B404", "B603"}  # each explained in pyproject.toml
NOSEC = re.compile(r"#\s*nosec\b(?P<rest>.*)$")
JUSTIFIED_NOSEC = re.compile(r"^\s+B\d{3}(?:[ ,]+B\d{3})*\s+#\s+\S.{8,}$")


def test_bandit_finds_nothing_unjustified() -> None:
    if importlib.util.find_spec("bandit") is None:
        pytest.fail("bandit is not installed: pip install -e '.[dev]' (or pip install bandit)",
                    pytrace=False)
    done = subprocess.run(
        [sys.executable, "-m", "bandit", "-c", str(PYPROJECT), "-r", *map(str, PACKAGES), "-f",
         "json", "-q"], capture_output=True, text=True, timeout=300, check=False)
    report = json.loads(done.stdout)
    assert not report["errors"], report["errors"]
    findings = [f"{r['filename']}:{r['line_number']} {r['test_id']} {r['issue_text']}"
                for r in report["results"]]
    assert not findings, "unjustified bandit findings:\n" + "\n".join(findings)
    assert done.returncode == 0, done.stderr[-2000:]
    assert report["metrics"]["_totals"]["loc"] > 1000, "bandit scanned the packages"


def test_only_the_justified_classes_are_skipped() -> None:
    config = tomllib.loads(PYPROJECT.read_text())["tool"]["bandit"]
    assert set(config.get("skips", [])) == JUSTIFIED_SKIPS, "explain a new skip in pyproject"
    assert not config.get("exclude_dirs"), "nothing of the package is excluded"
    text = PYPROJECT.read_text()
    for test_id in JUSTIFIED_SKIPS:
        assert re.search(rf"^# .*{test_id}\b", text, re.MULTILINE), f"{test_id}: give the reason"


def test_every_nosec_names_its_tests_and_a_reason() -> None:
    bare = []
    for path in sorted(p for package in PACKAGES for p in package.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            match = NOSEC.search(line)
            if match and not JUSTIFIED_NOSEC.match(match["rest"]):
                bare.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not bare, "write `# nosec BXXX # reason`:\n" + "\n".join(bare)
