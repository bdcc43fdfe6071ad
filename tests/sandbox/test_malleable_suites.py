"""The malleable runner on test suites no one here wrote: those shipped in the sdists of
published pure-Python packages (scripts/test-suites.txt; ``bash scripts/run.sh setup`` fetches
them, nothing is downloaded here). Each whole suite runs plainly and as a malleable run on 2
workers, and the verdicts (summary counts, subtests and warnings included, and exit status)
must be equal; then a copy of one suite with a failing test added, and one with a module that
cannot be imported. Real pytest processes throughout."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from malleable_runs import import_root, malleable_args, pinned_suites, pytest_run, suite_dir

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("name", "version"), pinned_suites())
def test_the_verdict_on_a_published_suite_is_a_plain_runs(name: str, version: str) -> None:
    suite = suite_dir(name, version)
    plain, ran = pytest_run(suite, [], path=(import_root(suite),))
    assert plain.status == 0 and plain.counts.get("passed", 0) > 50, ran.stdout[-3000:]
    malleable, done = pytest_run(suite, malleable_args(2), path=(import_root(suite),))
    assert malleable == plain, done.stdout[-3000:]


def copy_of_cachetools(tmp_path: Path) -> Path:
    name, version = next(p for p in pinned_suites() if p[0] == "cachetools")
    copy = tmp_path / "cachetools"
    shutil.copytree(suite_dir(name, version), copy)
    return copy


def test_a_published_suite_with_a_failing_test(tmp_path: Path) -> None:
    suite = copy_of_cachetools(tmp_path)
    (suite / "tests" / "test_zz_added.py").write_text(
        "def test_added_fails():\n    assert {'a': 1} == {'a': 2}\n")
    plain, _ = pytest_run(suite, [], path=(import_root(suite),))
    assert plain.status == 1 and plain.counts["failed"] == 1
    malleable, done = pytest_run(suite, malleable_args(2), path=(import_root(suite),))
    assert malleable == plain, done.stdout[-3000:]
    assert "FAILED tests/test_zz_added.py::test_added_fails" in done.stdout


def test_a_published_suite_with_a_collection_error(tmp_path: Path) -> None:
    suite = copy_of_cachetools(tmp_path)
    (suite / "tests" / "test_zz_broken.py").write_text("from cachetools import NoSuchCache\n")
    plain, _ = pytest_run(suite, [], path=(import_root(suite),))
    assert plain.status == 2 and plain.counts == {"errors": 1}
    malleable, done = pytest_run(suite, malleable_args(2), path=(import_root(suite),))
    assert malleable == plain, done.stdout[-3000:]
    assert "ImportError" in done.stdout
