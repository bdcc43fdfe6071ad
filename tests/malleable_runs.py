"""Helpers of the malleable runner's tests: a pytest run's verdict (the counts of its summary line
and its exit status), from a plain run and from a malleable one, as real processes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = "tangram_celery.sandbox.malleable.plugin"
_COUNT = re.compile(
    r"(\d+) ((?:subtests )?(?:passed|failed|errors?|skipped|xfailed|xpassed|deselected|warnings?))")
_SUMMARY = re.compile(r"\bin \d+(\.\d+)?s\b")
_NAMES = {"error": "errors", "warning": "warnings"}
SUITES_LIST = ROOT / "scripts" / "test-suites.txt"
SUITES_DIR = Path(sys.prefix) / "share" / "tangram-test-suites"


@dataclass(frozen=True)
class Verdict:
    """What a run says: its summary counts and its exit status."""

    counts: dict[str, int]
    status: int


def verdict_of(output: str, status: int) -> Verdict:
    """The counts of the last summary line of ``output`` (``1 failed, 3 passed in 0.1s``)."""
    lines = [line for line in output.splitlines() if _SUMMARY.search(line)]
    assert lines, f"no summary line in:\n{output[-3000:]}"
    counts = {_NAMES.get(name, name): int(n) for n, name in _COUNT.findall(lines[-1])}
    return Verdict(counts, status)


def pytest_run(cwd: Path, args: list[str], timeout: float = 600, path: tuple[Path, ...] = (),
               python: list[str] | None = None,
               ) -> tuple[Verdict, subprocess.CompletedProcess[str]]:
    """Run ``python -m pytest -q -p no:cacheprovider *args`` in ``cwd`` as a real process, with
    ``path`` and this checkout first on its ``PYTHONPATH`` (``python``: another interpreter's
    ``[python, "-m", "pytest"]``)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (*map(str, path), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run(
        [*(python or [sys.executable, "-m", "pytest"]), "-q", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=env, capture_output=True, text=True, timeout=timeout, check=False)
    return verdict_of(done.stdout, done.returncode), done


def malleable_args(workers: int, *extra: str) -> list[str]:
    """The arguments that make a run malleable with ``workers`` workers."""
    return ["-p", PLUGIN, f"--malleable={workers}", *extra]


def pinned_suites() -> list[tuple[str, str]]:
    """The (name, version) of every package whose test suite the set-up fetches."""
    pins = [line.split("==") for line in SUITES_LIST.read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    return [(name.strip(), version.strip()) for name, version in pins]


def suite_dir(name: str, version: str) -> Path:
    """Where the set-up unpacked ``name``'s sdist (its name with ``-`` or ``_``)."""
    for form in {name, name.replace("-", "_")}:
        found = SUITES_DIR / f"{form}-{version}"
        if found.is_dir():
            return found
    raise AssertionError(f"{name}=={version}'s test suite is not in {SUITES_DIR}; "
                         "run `bash scripts/run.sh setup`, which fetches it")


def import_root(suite: Path) -> Path:
    """The directory the suite's package imports from (``src/`` when it has one)."""
    return suite / "src" if (suite / "src").is_dir() else suite


def gated_suite(log: str, gate: str, tests: int, waits: str, *, deadline_s: int = 120,
                head: str = "", tail: str = "") -> str:
    """A pytest module that orders a malleable run by files, never by timing: ``test_00_gate``
    records itself and waits for the gate, then ``tests`` parametrized ``test_work`` record
    themselves and wait for the gate where ``waits`` (a condition on ``i``) holds, then run
    ``tail`` (indented body lines). A record is a line ``PID NAME CORES`` in the log, CORES the
    cores the test may run on. ``log`` and ``gate`` are Python expressions of their paths;
    ``head`` is module code before the tests."""
    return f'''
import os, pathlib, time, pytest
LOG = pathlib.Path({log})
GATE = pathlib.Path({gate})
{head}

def record(name):
    cores = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    with LOG.open("a") as log:
        log.write(f"{{os.getpid()}} {{name}} {{cores}}\\n")

def wait_for_the_gate():
    deadline = time.monotonic() + {deadline_s}
    while not GATE.exists():
        assert time.monotonic() < deadline, "the gate never opened"
        time.sleep(0.02)

def test_00_gate():
    record("gate")
    wait_for_the_gate()

@pytest.mark.parametrize("i", range({tests}))
def test_work(i):
    record(f"work{{i}}")
    if {waits}:
        wait_for_the_gate()
{tail}'''
