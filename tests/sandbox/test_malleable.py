"""The malleable runner's verdict (summary counts and exit status) equals a plain pytest run's,
on small suites written here with every outcome: passed, failed, error, skipped, xfailed,
xpassed, warnings, a skipped module, a collection error, no tests, deselection, ``-x``.
Real pytest processes throughout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from malleable_runs import malleable_args, pytest_run

from tangram_celery.sandbox import rewrite_parallelism
from tangram_celery.sandbox.malleable import PLUGIN, is_pytest_command, malleable_command, resize
from tangram_celery.sandbox.malleable.control import main as control_main

MIXED = '''
import os, warnings, pytest

@pytest.fixture(scope="session")
def worker_pid():
    return os.getpid()

def test_pass(worker_pid): assert worker_pid == os.getpid()
def test_fail(): assert 1 == 2
def test_skip(): pytest.skip("not here")
@pytest.mark.xfail(reason="known")
def test_xfail(): assert 0
@pytest.mark.xfail(reason="fixed since")
def test_xpass(): pass
def test_warns(): warnings.warn("careful", UserWarning)
@pytest.fixture
def broken(): raise RuntimeError("setup broke")
def test_error(broken): pass
@pytest.mark.parametrize("i", range(8))
def test_many(i, worker_pid): assert worker_pid == os.getpid()
'''

SUITES = {
    "mixed": {"test_mixed.py": MIXED,
              "test_skipped_module.py": "import pytest\npytest.importorskip('no_such_mod_xyz')\n"},
    "failing": {"test_f.py": "def test_a(): pass\ndef test_b(): assert 0, 'no'\n"
                             "def test_c(): pass\n"},
    "passing": {"test_p.py": "import pytest\n@pytest.mark.parametrize('i', range(5))\n"
                             "def test_p(i): pass\n"},
    "collection_error": {"test_ok.py": "def test_ok(): pass\n",
                         "test_broken.py": "import no_such_module_xyz\n"},
    "no_tests": {"test_empty.py": "def helper(): pass\n"},
}


def write_suite(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).write_text(text)
    return root


@pytest.mark.slow
@pytest.mark.parametrize(("suite", "extra", "status"), [
    ("mixed", [], 1), ("mixed", ["-ra"], 1), ("failing", [], 1), ("passing", [], 0),
    ("collection_error", [], 2),
    ("no_tests", [], 5), ("mixed", ["-k", "many"], 0), ("mixed", ["-k", "nothing_matches"], 5),
    ("collection_error", ["--continue-on-collection-errors"], 1),
])
def test_the_verdict_is_a_plain_runs(tmp_path: Path, suite: str, extra: list[str],
                                     status: int) -> None:
    root = write_suite(tmp_path / suite, SUITES[suite])
    plain, _ = pytest_run(root, ["-p", "no:randomly", *extra])
    malleable, done = pytest_run(root, ["-p", "no:randomly", *malleable_args(2), *extra])
    assert plain.status == status
    assert malleable == plain, done.stdout[-3000:]


@pytest.mark.slow
def test_failures_are_shown_as_in_a_plain_run(tmp_path: Path) -> None:
    root = write_suite(tmp_path / "failing", SUITES["failing"])
    _, done = pytest_run(root, ["-rA", *malleable_args(2)])
    assert "AssertionError: no" in done.stdout
    assert "FAILED test_f.py::test_b - AssertionError: no" in done.stdout
    assert "PASSED test_f.py::test_a" in done.stdout


@pytest.mark.slow
def test_stop_at_the_first_failure(tmp_path: Path) -> None:
    root = write_suite(tmp_path / "failing", SUITES["failing"])
    verdict, done = pytest_run(root, ["-x", *malleable_args(1)])
    assert verdict.status == 1
    assert verdict.counts["failed"] == 1
    assert "stopping after 1 failures" in done.stdout


@pytest.mark.slow
def test_a_crashing_test_fails_and_the_run_goes_on(tmp_path: Path) -> None:
    root = write_suite(tmp_path / "crash", {"test_c.py": (
        "import os\ndef test_a(): pass\ndef test_crash(): os._exit(9)\n"
        "def test_b(): pass\ndef test_c(): pass\n")})
    verdict, done = pytest_run(root, malleable_args(2))
    assert verdict.counts == {"failed": 1, "passed": 3}, done.stdout[-3000:]
    assert verdict.status == 1
    assert "crashed running this test (exit status 9)" in done.stdout


@pytest.mark.slow
def test_each_worker_has_its_session_fixtures_and_the_stats_say_who_ran_what(
        tmp_path: Path) -> None:
    root = write_suite(tmp_path / "mixed", SUITES["mixed"])
    stats = tmp_path / "stats.json"
    verdict, _ = pytest_run(root, [*malleable_args(2), f"--malleable-stats={stats}"])
    assert verdict.counts["passed"] == 10
    data = json.loads(stats.read_text())
    assert data["tests"] == data["done"] == 15
    assert len(data["workers"]) == 2
    assert sum(w["tests"] for w in data["workers"]) == 15
    assert all(w["collect_s"] is not None and w["collect_s"] > 0 for w in data["workers"])


def test_a_command_that_is_not_pytest_is_left_alone() -> None:
    assert malleable_command("python solution.py < in.txt", 4) == "python solution.py < in.txt"
    assert not is_pytest_command("echo pytest")
    assert is_pytest_command("cd /work && python -m pytest -q tests")
    assert malleable_command("cd /work && pytest -q tests", 3) == (
        f"cd /work && pytest -p {PLUGIN} --malleable=3 -q tests")
    assert malleable_command("pytest -n 4 tests", 3) == "pytest -n 4 tests"
    once = malleable_command("pytest -q", 2)
    assert malleable_command(once, 3) == once
    assert rewrite_parallelism(once, 4) == once, "a malleable run never also gets -n"
    assert malleable_command("X=1 python3 -m pytest", 2, control="/w/run sock") == (
        f"X=1 python3 -m pytest -p {PLUGIN} --malleable=2 --malleable-control='/w/run sock'")
    with pytest.raises(ValueError, match="workers"):
        malleable_command("pytest", 0)


@pytest.mark.slow
def test_the_sandboxes_pytest_gives_the_same_verdict(tmp_path: Path) -> None:
    """Inside a sandbox pytest runs on the system's Python (Debian's python3-pytest, which the
    set-up installs); the runner needs nothing else."""
    root = write_suite(tmp_path / "mixed", SUITES["mixed"])
    system = ["/usr/bin/python3", "-m", "pytest"]
    plain, _ = pytest_run(root, [], python=system)
    malleable, done = pytest_run(root, malleable_args(2), python=system)
    assert plain.status == 1
    assert malleable == plain, done.stdout[-3000:] + done.stderr[-3000:]


def test_the_control_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert control_main([]) == 2
    assert "grow|shrink|status" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown operation"):
        resize(str(tmp_path / "none.sock"), "explode")
    with pytest.raises(OSError):
        control_main([str(tmp_path / "none.sock"), "status"])


@pytest.mark.slow
def test_workers_that_collect_in_another_order_still_take_tests(tmp_path: Path) -> None:
    """Each worker shuffles its collection with its own seed (as pytest-randomly does); every
    test waits until both workers have run one, so the run passes only if the second worker,
    whose order differs from the first's, takes tests."""
    root = write_suite(tmp_path / "shuffled", {
        "conftest.py": ("import os, random\n"
                        "def pytest_collection_modifyitems(items):\n"
                        "    random.Random(os.getpid()).shuffle(items)\n"),
        "test_barrier.py": (
            "import os, pathlib, time, pytest\n"
            "LOG = pathlib.Path(__file__).with_name('pids')\n"
            "@pytest.mark.parametrize('i', range(6))\n"
            "def test_both_workers_run(i):\n"
            "    with LOG.open('a') as log:\n"
            "        log.write(f'{os.getpid()}\\n')\n"
            "    deadline = time.monotonic() + 20\n"
            "    while len(set(LOG.read_text().split())) < 2:\n"
            "        assert time.monotonic() < deadline, 'the other worker took no test'\n"
            "        time.sleep(0.02)\n")})
    verdict, done = pytest_run(root, malleable_args(2))
    assert verdict.counts == {"passed": 6} and verdict.status == 0, done.stdout[-3000:]
