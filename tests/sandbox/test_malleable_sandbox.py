"""The malleable runner inside a real bubblewrap sandbox, on the sandbox's own Python and pytest:
its modules shipped as the action's files (standard library only besides pytest), its socket in
the sandbox's /tmp, its workers children of the action. The verdict equals a plain run's in the
same sandbox, and the output cap keeps the head and the tail, where the summary line is. The
node grows a sandboxed run from the host."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pytest
from conftest import Run, _host_pids_with
from malleable_runs import ROOT, gated_suite, malleable_args, verdict_of
from test_malleable import MIXED
from test_malleable_resize import SUITE, lines, wait_until

from tangram_celery.client import test_run_action
from tangram_celery.pools.conversion import exec_spec
from tangram_celery.sandbox import ExecOutcome, ExecSpec, SandboxBackend
from tangram_celery.sandbox.bwrap import BwrapBackend
from tangram_celery.sandbox.malleable import CoreResizer, resize, runner_files
from tangram_celery.sandbox.malleable.shipping import RUNNER_MODULES

pytestmark = pytest.mark.slow

RUNNER = ".runner"


def test_the_shipped_modules_are_what_the_plugin_imports() -> None:
    listed = subprocess.run(
        ["/usr/bin/python3", "-c",
         "import json, sys\nimport tangram_celery.sandbox.malleable.plugin\n"
         "print(json.dumps(sorted(n for n in sys.modules if n.startswith('tangram_celery'))))"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(listed.stdout) == sorted(RUNNER_MODULES)
    files = runner_files(RUNNER)
    assert f"{RUNNER}/tangram_celery/sandbox/malleable/plugin.py" in files
    assert f"{RUNNER}/tangram_celery/sandbox/__init__.py" in files
    assert files[f"{RUNNER}/tangram_celery/errors.py"] == (
        ROOT / "tangram_celery" / "errors.py").read_text()


def test_a_malleable_run_in_a_sandbox(run: Run, two_cores: tuple[int, int]) -> None:
    files = {**runner_files(RUNNER), "suite/test_mixed.py": MIXED}
    pytest = f"PYTHONPATH=/work/{RUNNER} python3 -m pytest -q -p no:cacheprovider -rA"
    plain = run(f"{pytest} suite", files=files, cores=two_cores, timeout_s=120)
    malleable = run(f"{pytest} {' '.join(malleable_args(2))} suite", files=files,
                    cores=two_cores, timeout_s=120, output_cap_bytes=1024)
    assert verdict_of(plain.stdout, plain.exit_code or 0).status == 1, plain.stdout
    assert verdict_of(malleable.stdout, malleable.exit_code or 0) == verdict_of(
        plain.stdout, plain.exit_code or 0), malleable.stdout + malleable.stderr
    assert malleable.stdout_cut_bytes > 0, "the -rA output is over the cap of 1 KiB"
    assert malleable.stdout.splitlines()[0].endswith("[100%]"), "the head: the progress line"


def test_the_node_grows_a_sandboxed_run_through_its_work_dir(
        run: Run, two_cores: tuple[int, int], sandbox_root: Path) -> None:
    """The run's control socket is in the work dir, so the node reaches it from the host (the
    sandbox has no network at all) and grows the run while its first test waits at a gate."""
    files = {**runner_files(RUNNER), "suite/test_resize.py": SUITE}
    command = (f"PYTHONPATH=/work/{RUNNER} MALLEABLE_LOG=/work/log MALLEABLE_GATE=/work/gate "
               f"python3 -m pytest -q -p no:cacheprovider "
               f"{' '.join(malleable_args(1, '--malleable-control=/work/control.sock'))} suite")
    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(run, command, files=files, cores=two_cores, timeout_s=120)
        wait_until(lambda: any(sandbox_root.rglob("log")) or running.done(), "the first test")
        log = next(sandbox_root.rglob("log"))
        wait_until(lambda: any(name == "gate" for _, name in lines(log)), "the gate test")
        answer = resize(str(log.with_name("control.sock")), "grow")
        assert answer["ok"] and answer["workers"] == 2
        wait_until(lambda: len({pid for pid, _ in lines(log)}) == 2, "the new worker's tests")
        log.with_name("gate").touch()
        outcome = running.result(timeout=120)
    assert verdict_of(outcome.stdout, outcome.exit_code or 0).counts == {"passed": 17}, (
        outcome.stdout + outcome.stderr)
    assert outcome.exit_code == 0


AFFINITY_SUITE = gated_suite('"/work/log"', '"/work/gate"', 12, "i >= 4", deadline_s=60)


def records(log: Path) -> list[tuple[str, str, frozenset[int]]]:
    found = []
    for line in log.read_text().splitlines() if log.exists() else []:
        pid, name, cores = line.split()
        found.append((pid, name, frozenset(int(c) for c in cores.split(",") if c)))
    return found


def worker_cores() -> set[frozenset[int]]:
    """The cores each sandboxed worker of a malleable run may run on, seen from the host."""
    found = set()
    for pid in _host_pids_with("--malleable-connect=/work/control.sock"):
        try:
            found.add(frozenset(os.sched_getaffinity(pid)))
        except OSError:
            continue
    return found


def start_sandboxed(run: Run, pool: ThreadPoolExecutor, workers: int, cores: tuple[int, ...],
                    ) -> Future[ExecOutcome]:
    command = (f"PYTHONPATH=/work/{RUNNER} python3 -m pytest -q -p no:cacheprovider "
               f"{' '.join(malleable_args(workers, '--malleable-control=/work/control.sock'))}"
               " suite")
    files = {**runner_files(RUNNER), "suite/test_cores.py": AFFINITY_SUITE}
    return pool.submit(run, command, files=files, cores=cores, timeout_s=120)


def test_the_node_shrinks_and_grows_the_cpuset_with_the_workers(
        backend: BwrapBackend, run: Run, two_cores: tuple[int, int], sandbox_root: Path) -> None:
    first, second = two_cores
    with ThreadPoolExecutor(max_workers=1) as pool:
        running = start_sandboxed(run, pool, 2, two_cores)
        wait_until(lambda: any(sandbox_root.rglob("log")) or running.done(), "the first test")
        log = next(sandbox_root.rglob("log"))
        wait_until(lambda: len({pid for pid, _, _ in records(log)}) == 2, "both workers")
        resizer = CoreResizer(backend, "t1", two_cores,
                              partial(resize, str(log.with_name("control.sock"))))
        assert resizer.take() == second
        assert resizer.cores == (first,)
        assert worker_cores() == {frozenset({first})}, "every worker left the core at once"
        assert resizer.retire()
        shrunk = len(records(log))
        assert resizer.grow(second)
        assert list(resizer.cores) == [first, second]
        wait_until(lambda: len({pid for pid, _, _ in records(log)}) == 3, "the new worker")
        assert frozenset({first, second}) in worker_cores()
        log.with_name("gate").touch()
        outcome = running.result(timeout=120)
    assert verdict_of(outcome.stdout, outcome.exit_code or 0).counts == {"passed": 13}, (
        outcome.stdout + outcome.stderr)
    seen = records(log)
    newest = seen[-1][0] if seen[-1][0] not in {p for p, _, _ in seen[:shrunk]} else next(
        p for p, _, _ in seen[shrunk:] if p not in {q for q, _, _ in seen[:shrunk]})
    assert {cores for pid, _, cores in seen[shrunk:] if pid == newest} == {
        frozenset({first, second})}, seen


def test_a_pools_malleable_test_run_in_each_sandbox(
        sandbox: SandboxBackend, two_cores: tuple[int, int]) -> None:
    """The exec spec a CPU node makes of a ``malleable`` test-run action runs in every kind of
    sandbox (bwrap, bwrap on rlimits, Docker): the verdict is pytest's, and the runner's files
    are gone afterwards."""
    tid = f"m-{uuid.uuid4().hex[:8]}"
    action = test_run_action(tid, "python3 -m pytest -q -p no:cacheprovider suite",
                             payload={"malleable": True,
                                      "files": {"suite/test_mixed.py": MIXED}})
    try:
        outcome = sandbox.run(exec_spec(action, (0, 1), two_cores, 120.0))
        listed = sandbox.run(ExecSpec(tid, "ls -A /work", {}, 20.0, two_cores[:1]))
    finally:
        sandbox.end_trajectory(tid)
    verdict = verdict_of(outcome.stdout, outcome.exit_code or 0)
    assert verdict.status == 1 and verdict.counts["passed"] == 10, (
        outcome.stdout + outcome.stderr)
    assert listed.stdout.split() == ["suite"]
