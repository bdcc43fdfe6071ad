"""What the embedded sandbox must do for honest actions: persistence, pinning, units, pytest -n."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tangram_celery.errors import SandboxError, SandboxLostError
from tangram_celery.sandbox import (
    ExecOutcome,
    ExecSpec,
    SandboxBackend,
    SandboxCapacityError,
    SandboxLimits,
    rewrite_parallelism,
)
from tangram_celery.sandbox.bwrap import BwrapBackend
from tangram_celery.sandbox.bwrap.trajectory import Trajectory

Run = Callable[..., ExecOutcome]


def test_backend_satisfies_the_protocol(backend: BwrapBackend) -> None:
    assert isinstance(backend, SandboxBackend)
    assert backend.name == "bwrap"


def test_files_persist_within_a_trajectory_and_vanish_at_its_end(
    run: Run, backend: BwrapBackend
) -> None:
    first = run("cat src/a.txt; echo made-by-action-1 > note.txt", tid="p1",
                files={"src/a.txt": "from spec"})
    assert first.exit_code == 0 and first.stdout == "from spec"
    second = run("cat note.txt src/a.txt; pwd", tid="p1")
    assert second.stdout == "made-by-action-1\nfrom spec/work\n"
    assert backend.trajectories() == ["p1"]
    workdirs = [p for p in backend.instance_dir.iterdir() if not p.name.startswith("ready-")]
    assert len(workdirs) == 1
    backend.end_trajectory("p1")
    backend.end_trajectory("p1")  # idempotent
    assert backend.trajectories() == [] and not workdirs[0].exists()
    again = run("ls -A", tid="p1")
    assert again.stdout == "" and again.exit_code == 0


def test_a_trajectory_started_again_while_its_old_self_is_removed_keeps_its_files(
    run: Run, backend: BwrapBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    run("echo old > note.txt", tid="again")
    dispose = backend._dispose
    started: list[str] = []

    def dispose_after_a_new_start(traj: Trajectory) -> None:
        started.append(run("echo new > note.txt; cat note.txt", tid="again").stdout)
        dispose(traj)

    monkeypatch.setattr(backend, "_dispose", dispose_after_a_new_start)
    backend.end_trajectory("again")
    assert started == ["new\n"]
    assert run("cat note.txt", tid="again").stdout == "new\n"


def test_trajectories_have_separate_work_dirs(run: Run) -> None:
    run("echo A > mine.txt", tid="sep-a")
    run("echo B > mine.txt", tid="sep-b")
    assert run("cat mine.txt", tid="sep-a").stdout == "A\n"
    assert run("cat mine.txt", tid="sep-b").stdout == "B\n"


def test_affinity_is_exactly_the_given_cores(run: Run, two_cores: tuple[int, int]) -> None:
    first, second = two_cores
    read = "grep Cpus_allowed_list /proc/self/status | cut -f2; echo $TANGRAM_UNITS; nproc"
    assert run(read, cores=(second,)).stdout.split() == [str(second), "1", "1"]
    both = run(read, cores=(first, second)).stdout.split()
    assert both[1:] == ["2", "2"]
    assert both[0] in (f"{first}-{second}", f"{first},{second}")


def test_oversubscribed_units_share_a_core(run: Run) -> None:
    out = run("grep Cpus_allowed_list /proc/self/status | cut -f2; echo $TANGRAM_UNITS",
              cores=(0, 0, 0))
    assert out.stdout.split() == ["0", "3"]


def test_units_and_extra_env(run: Run) -> None:
    out = run("echo $TANGRAM_UNITS $MY_FLAG $HOME $USER", env={"MY_FLAG": "on"})
    assert out.stdout == "1 on /work sandbox\n"
    explicit = run("echo $TANGRAM_UNITS", env={"TANGRAM_UNITS": "4"})  # 4 units on 1 CPU
    assert explicit.stdout == "4\n"


def test_exit_codes_signals_stdin_and_timings(run: Run) -> None:
    assert run("exit 3").exit_code == 3
    killed = run("kill -9 $$")
    assert (killed.exit_code, killed.signal, killed.timed_out) == (137, 9, False)
    echoed = run("tr a-z A-Z", stdin="hello")
    assert echoed.stdout == "HELLO"
    timed = run("sleep 0.3")
    assert timed.exec_s >= 0.3 and 0 < timed.setup_s < 5
    assert timed.started_at <= timed.finished_at
    assert timed.finished_at - timed.started_at >= 0.3


def test_pytest_runs_with_xdist_workers_inside(run: Run, two_cores: tuple[int, int]) -> None:
    tests = "\n".join(
        f"def test_{i}():\n    import os\n    assert os.environ['PYTEST_XDIST_WORKER']\n"
        for i in range(4)
    )
    command = rewrite_parallelism("python3 -m pytest -q -p no:cacheprovider test_w.py", 2)
    assert "-n 2" in command
    out = run(command, files={"test_w.py": tests}, cores=two_cores, timeout_s=60)
    assert out.exit_code == 0, out.stdout + out.stderr
    assert "4 passed" in out.stdout


def test_concurrent_runs_from_threads(run: Run) -> None:
    def job(i: int) -> str:
        outputs = [run(f"echo {i}-{k} > f; cat f", tid=f"conc-{i}").stdout for k in range(3)]
        return ",".join(o.strip() for o in outputs)

    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(job, range(6)))
    assert results == [f"{i}-0,{i}-1,{i}-2" for i in range(6)]


def test_end_trajectory_kills_a_running_action(backend: BwrapBackend) -> None:
    outcome: list[object] = []

    def long_action() -> None:
        try:
            outcome.append(backend.run(ExecSpec("doomed", "sleep 30", {}, 60.0, (0,))))
        except SandboxError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=long_action)
    thread.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    backend.end_trajectory("doomed")
    thread.join(10)
    assert not thread.is_alive() and time.monotonic() - t0 < 5
    result = outcome[0]
    assert isinstance(result, SandboxError) or result.signal == 9  # type: ignore[attr-defined]
    assert not isinstance(result, SandboxLostError), "an ended trajectory is not a lost sandbox"
    assert backend.trajectories() == []


def test_close_removes_everything_and_refuses_new_work(sandbox_root: Path) -> None:
    backend = BwrapBackend(sandbox_root, SandboxLimits(memory_mb=256, pids=64))
    backend.run(ExecSpec("c1", "echo x > f", {}, 10.0, (0,)))
    cgroup_bases = list(backend.cgroups.bases.values()) if backend.cgroups else []
    backend.close()
    backend.close()
    assert not backend.instance_dir.exists()
    assert all(not base.exists() for base in cgroup_bases)
    assert list(sandbox_root.iterdir()) == []
    with pytest.raises(SandboxError, match="closed"):
        backend.run(ExecSpec("c1", "true", {}, 10.0, (0,)))


def test_cgroup_limits_are_in_force(backend: BwrapBackend) -> None:
    assert backend.cgroups is not None
    assert set(backend.cgroups.controllers) == {"memory", "pids", "cpuset"}, (
        f"cgroup v1 controllers unavailable: {backend.cgroups.unavailable}")


def test_uid_is_reused_after_a_trajectory_ends(sandbox_tools: None, sandbox_root: Path) -> None:
    with BwrapBackend(sandbox_root, SandboxLimits(), ready=0) as backend:
        backend.run(ExecSpec("u1", "true", {}, 10.0, (0,)))
        uid = backend._trajs["u1"].uid
        backend.end_trajectory("u1")
        assert not os.path.exists(f"/tmp/.bubblewrap-{uid}")  # bwrap's mount point, cleaned up
        backend.run(ExecSpec("u2", "true", {}, 10.0, (0,)))
        assert backend._trajs["u2"].uid == uid


def test_uid_pools_of_two_backends_never_overlap(sandbox_root: Path) -> None:
    # no ready sandboxes: they would hold uids of their own and race for the freed one
    first = BwrapBackend(sandbox_root / "a", SandboxLimits(), uid_base=1_900_000, uid_count=3,
                         ready=0)
    second = BwrapBackend(sandbox_root / "b", SandboxLimits(), uid_base=1_900_000, uid_count=3,
                          ready=0)
    try:
        first.run(ExecSpec("x", "true", {}, 10.0, (0,)))
        second.run(ExecSpec("y", "true", {}, 10.0, (0,)))
        assert first._trajs["x"].uid != second._trajs["y"].uid
        first.run(ExecSpec("x2", "true", {}, 10.0, (0,)))
        with pytest.raises(SandboxCapacityError, match="uid_count"):
            second.run(ExecSpec("y2", "true", {}, 10.0, (0,)))
        first.end_trajectory("x")
        second.run(ExecSpec("y2", "true", {}, 10.0, (0,)))  # the freed uid is free host-wide
    finally:
        first.close()
        second.close()
