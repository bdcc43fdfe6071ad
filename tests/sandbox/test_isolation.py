"""A node never runs silently unenforced: it refuses to start without cores and memory held,
unless told best-effort, and then says what it does not enforce."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tangram_celery.errors import SandboxSetupError
from tangram_celery.sandbox import SandboxLimits
from tangram_celery.sandbox.bwrap import BwrapBackend
from tangram_celery.sandbox.bwrap import backend as bwrap_backend
from tangram_celery.sandbox.cgroups import CgroupV2
from tangram_celery.sandbox.isolation import (
    AFFINITY,
    CGROUP,
    CHECKED_AFTER,
    CPUSET,
    RLIMIT,
    TMPFS,
    WIDENABLE,
    Isolation,
    check_mode,
    require,
)

LIMITS = SandboxLimits(memory_mb=128, pids=32, workdir_mb=8, tmp_mb=8)


@pytest.mark.parametrize(("cores", "memory", "pids", "workdir", "gaps"), [
    (CPUSET, CGROUP, CGROUP, TMPFS, ()),
    (AFFINITY, CGROUP, CGROUP, CHECKED_AFTER, ("workdir",)),
    (AFFINITY, RLIMIT, RLIMIT, CHECKED_AFTER, ("memory", "pids", "workdir")),
    (WIDENABLE, CGROUP, CGROUP, TMPFS, ("cores",)),
])
def test_the_gaps_are_what_is_not_held(cores: str, memory: str, pids: str, workdir: str,
                                       gaps: tuple[str, ...]) -> None:
    isolation = Isolation("best-effort", "cgroup v2", cores, memory, pids, workdir)
    assert isolation.gaps == gaps
    summary = isolation.summary()
    assert summary.startswith("enforced" if not gaps else "best-effort, not enforced")
    assert all(gap in summary for gap in gaps)
    assert isolation.to_json()["gaps"] == list(gaps)


@pytest.mark.parametrize(("cores", "memory", "refused"), [
    (CPUSET, CGROUP, False), (AFFINITY, CGROUP, False), (AFFINITY, RLIMIT, True),
    (WIDENABLE, CGROUP, True),
])
def test_strict_refuses_without_cores_or_memory(cores: str, memory: str, refused: bool) -> None:
    isolation = Isolation("strict", "no cgroups", cores, memory, RLIMIT, CHECKED_AFTER,
                          ("memory: no cgroup v1 hierarchy mounted for it",))
    if not refused:
        require(isolation)
        return
    with pytest.raises(SandboxSetupError) as caught:
        require(isolation)
    message = str(caught.value)
    assert "no cgroup v1 hierarchy mounted" in message
    assert "TANGRAM_SANDBOX_ENFORCE=best-effort" in message and "Delegate=yes" in message
    require(Isolation("best-effort", *[getattr(isolation, f) for f in
                                       ("cgroups", "cores", "memory", "pids", "workdir")]))


def test_an_unknown_mode_is_refused() -> None:
    assert check_mode("best-effort") == "best-effort"
    with pytest.raises(SandboxSetupError, match="strict"):
        check_mode("loose")


def test_a_node_without_cgroups_refuses_to_start(sandbox_tools: None, sandbox_root: Path) -> None:
    with pytest.raises(SandboxSetupError, match="cannot enforce memory") as caught:
        BwrapBackend(sandbox_root, LIMITS, cgroups=False, ready=0)
    assert "best-effort" in str(caught.value)
    assert not any(sandbox_root.iterdir()), "a refused backend leaves nothing behind"


def test_a_cgroup_v2_host_that_delegates_nothing_is_refused(
        sandbox_tools: None, sandbox_root: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On the cgroup v2 STAND-IN (see test_cgroups_v2): a worker group that offers no
    controllers, as on a v2 host without delegation."""
    mount = tmp_path / "cgroup"
    (mount / "svc").mkdir(parents=True)
    (mount / "svc" / "cgroup.controllers").write_text("cpu io\n")
    mountinfo, proc_cgroup = tmp_path / "mountinfo", tmp_path / "proc-cgroup"
    mountinfo.write_text(f"29 1 0:26 / {mount} rw - cgroup2 cgroup2 rw\n")
    proc_cgroup.write_text("0::/svc\n")
    monkeypatch.setattr(bwrap_backend, "open_cgroups",
                        lambda: CgroupV2(mountinfo=mountinfo, proc_cgroup=proc_cgroup))
    with pytest.raises(SandboxSetupError, match="does not offer it") as caught:
        BwrapBackend(sandbox_root, LIMITS, ready=0)
    assert "cores and memory" in str(caught.value) or "memory" in str(caught.value)


def test_best_effort_runs_and_says_what_it_does_not_enforce(
        sandbox_tools: None, sandbox_root: Path) -> None:
    backend = BwrapBackend(sandbox_root, LIMITS, cgroups=False, enforce="best-effort", ready=0)
    try:
        isolation = backend.isolation
        assert isolation.cores == AFFINITY, "seccomp keeps the node-set affinity from widening"
        assert {"memory", "pids"} <= set(isolation.gaps)
        assert isolation.summary().startswith("best-effort, not enforced: memory, pids")
        assert "cgroups: turned off" in isolation.reasons
    finally:
        backend.close()


def test_a_root_node_with_cgroups_enforces_everything(sandbox_tools: None,
                                                      sandbox_root: Path) -> None:
    assert os.geteuid() == 0, "the test suite runs as root (the README's test command)"
    backend = BwrapBackend(sandbox_root, LIMITS, ready=0)
    try:
        assert backend.isolation.gaps == (), backend.isolation.reasons
        assert backend.isolation.summary().startswith("enforced: cgroup v")
    finally:
        backend.close()


@pytest.mark.slow
def test_the_cgroup_v2_check_script_runs_its_checks_on_this_host() -> None:
    """scripts/check-cgroup2.sh is what runs the real v2 path on a v2 host; here (v1) it runs
    the same checks with --any, so it cannot rot unseen."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "check-cgroup2.sh"
    done = subprocess.run(["bash", str(script), "--any"], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    for check in ("exclusive cores", "memory kill reported", "pids capped",
                  "affinity widening refused", "work dir capped while running"):
        assert f"PASS {check}" in done.stdout, done.stdout
