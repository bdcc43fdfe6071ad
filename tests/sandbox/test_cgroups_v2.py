"""cgroup v2, against a STAND-IN: a directory tree with the v2 file interface.

These machines run cgroup v1 only, so a real unified hierarchy with the cpuset, memory and pids
controllers cannot exist here. The stand-in has the files a v2 group has (``cgroup.controllers``,
``cgroup.subtree_control``, ``cgroup.procs``, ``cgroup.type``, ``memory.events``) as plain files:
it shows what the code reads and writes, not what the kernel would make of it.
``scripts/check-cgroup2.sh`` runs the real v2 path end to end on a cgroup v2 host.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tangram_celery.sandbox.cgroups import CgroupLimits, CgroupV1, CgroupV2, open_cgroups
from tangram_celery.sandbox.cgroups.v2 import LEAF, hand_down, parse_unified, unified_path

OWN = "system.slice/tangram-node.service"


def stand_in(tmp_path: Path, offered: str = "cpuset cpu io memory pids", procs: str = "101\n102\n",
             root: bool = False) -> tuple[Path, Path, Path]:
    """(mountinfo, proc_cgroup, the worker's group) of a stand-in v2 tree under ``tmp_path``."""
    mount = tmp_path / "cgroup"
    group = mount if root else mount / OWN
    group.mkdir(parents=True)
    (group / "cgroup.controllers").write_text(offered + "\n")
    (group / "cgroup.subtree_control").write_text("")
    (group / "cgroup.procs").write_text(procs)
    if not root:
        (group / "cgroup.type").write_text("domain\n")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"29 1 0:26 / {mount} rw,nosuid,nodev - cgroup2 cgroup2 rw\n")
    proc_cgroup = tmp_path / "proc-cgroup"
    proc_cgroup.write_text("0::/\n" if root else f"0::/{OWN}\n")
    return mountinfo, proc_cgroup, group


def v2_of(tmp_path: Path, offered: str = "cpuset cpu io memory pids") -> CgroupV2:
    mountinfo, proc_cgroup, _ = stand_in(tmp_path, offered)
    return CgroupV2(mountinfo=mountinfo, proc_cgroup=proc_cgroup)


def test_the_unified_mount_and_own_group_are_read() -> None:
    text = ("24 1 0:22 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n"
            "25 1 0:23 / /proc rw - proc proc rw\n")
    assert parse_unified(text) == (Path("/sys/fs/cgroup"), "/")
    assert parse_unified("25 1 0:23 / /proc rw - proc proc rw\n") is None
    assert unified_path("1:name=systemd:/x\n0::/kubepods/pod1/c1\n") == "/kubepods/pod1/c1"


def test_a_delegated_group_hands_its_controllers_down_after_moving_its_processes(
        tmp_path: Path) -> None:
    mountinfo, proc_cgroup, group = stand_in(tmp_path)
    cgroups = CgroupV2(mountinfo=mountinfo, proc_cgroup=proc_cgroup)
    assert cgroups.unavailable == {}
    assert cgroups.controllers == ("memory", "pids", "cpuset")
    assert cgroups.moved == [101, 102], "v2: a group handing controllers down holds no process"
    assert (group / LEAF).is_dir()
    assert (group / "cgroup.subtree_control").read_text() == "+memory +pids +cpuset"
    [base] = set(cgroups.bases.values())
    assert base.parent == group and base.name.startswith("tangram-")
    assert (base / "cgroup.subtree_control").read_text() == "+memory +pids +cpuset"


def test_an_action_group_gets_its_cores_memory_without_swap_and_pids(tmp_path: Path) -> None:
    cgroups = v2_of(tmp_path)
    group = cgroups.create(CgroupLimits(256 << 20, 64, (3, 1, 3)), 1500000, 1500000)
    assert group is not None
    [path] = group.dirs()
    assert set(group.paths.values()) == {path}, "one v2 directory holds every controller"
    assert (path / "memory.max").read_text() == str(256 << 20)
    assert (path / "memory.swap.max").read_text() == "0"
    assert (path / "pids.max").read_text() == "64"
    assert (path / "cpuset.cpus").read_text() == "1,3"
    assert group.procs_files() == [path / "cgroup.procs"]
    assert group.set_cpus((0,)) and (path / "cpuset.cpus").read_text() == "0"


def test_oom_kills_are_read_from_memory_events(tmp_path: Path) -> None:
    cgroups = v2_of(tmp_path)
    group = cgroups.create(CgroupLimits(1 << 20, 8, ()), 0, 0)
    assert group is not None
    [path] = group.dirs()
    (path / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n")
    assert group.oom_killed()
    group.oom_base = group.oom_count()
    assert not group.oom_killed()
    assert not (path / "cpuset.cpus").exists(), "no cores asked: the parent's cpuset holds"


def test_the_root_group_keeps_its_processes(tmp_path: Path) -> None:
    mountinfo, proc_cgroup, group = stand_in(tmp_path, root=True)
    cgroups = CgroupV2(mountinfo=mountinfo, proc_cgroup=proc_cgroup)
    assert cgroups.moved == [] and not (group / LEAF).exists()
    assert cgroups.controllers == ("memory", "pids", "cpuset")


def test_controllers_already_handed_down_are_left_alone(tmp_path: Path) -> None:
    group = stand_in(tmp_path)[2]
    (group / "cgroup.subtree_control").write_text("cpuset memory pids\n")
    assert hand_down(group, ("memory", "pids", "cpuset")) == []
    assert (group / "cgroup.subtree_control").read_text() == "cpuset memory pids\n"


def test_a_controller_not_delegated_is_reported_with_what_to_do(tmp_path: Path) -> None:
    cgroups = v2_of(tmp_path, offered="cpu io pids")
    assert cgroups.controllers == ("pids",)
    assert set(cgroups.unavailable) == {"memory", "cpuset"}
    assert "Delegate=yes" in cgroups.unavailable["memory"]
    assert "TANGRAM_SANDBOX_ENFORCE=best-effort" in cgroups.unavailable["cpuset"]


def test_a_group_this_worker_cannot_write_is_reported(tmp_path: Path) -> None:
    mountinfo, proc_cgroup, group = stand_in(tmp_path)
    (group / "cgroup.subtree_control").unlink()
    (group / "cgroup.subtree_control").mkdir()  # any write to it now fails, as a refusal would
    cgroups = CgroupV2(mountinfo=mountinfo, proc_cgroup=proc_cgroup)
    assert cgroups.controllers == ()
    assert all("not writable" in why for why in cgroups.unavailable.values())
    assert [p.name for p in group.iterdir() if p.name.startswith("tangram-")] == []


def test_close_removes_the_base(tmp_path: Path) -> None:
    cgroups = v2_of(tmp_path)
    [base] = set(cgroups.bases.values())
    (base / "cgroup.subtree_control").unlink()  # the kernel's files go with the group
    cgroups.close(timeout_s=1.0)
    assert not base.exists() and cgroups.controllers == ()


@pytest.mark.parametrize(("mounts", "expected"), [
    ("29 1 0:26 / {mount} rw - cgroup2 cgroup2 rw\n", CgroupV2),
    ("30 1 0:27 / {mount} rw - cgroup cgroup rw,memory\n", CgroupV1),
    ("29 1 0:26 / {mount}/unified rw - cgroup2 cgroup2 rw\n"
     "30 1 0:27 / {mount}/memory rw - cgroup cgroup rw,memory\n", CgroupV1),
])
def test_the_host_hierarchy_is_detected(tmp_path: Path, mounts: str, expected: type) -> None:
    mountinfo, proc_cgroup, _ = stand_in(tmp_path)
    mountinfo.write_text(mounts.format(mount=tmp_path / "cgroup"))
    found = open_cgroups(mountinfo=mountinfo, proc_cgroup=proc_cgroup)
    try:
        assert type(found) is expected
    finally:
        found.close(timeout_s=1.0)


def test_a_root_worker_whose_group_lacks_controllers_uses_the_root_group(tmp_path: Path) -> None:
    """As on a host whose service group was given only ``memory``: the base goes below the
    root group (no ``cgroup.type``: it hands controllers down and keeps its processes)."""
    mountinfo, proc_cgroup, group = stand_in(tmp_path, offered="memory")
    top = tmp_path / "cgroup"
    (top / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (top / "cgroup.subtree_control").write_text("memory\n")
    (top / "cgroup.procs").write_text("1\n")
    cgroups = CgroupV2(mountinfo=mountinfo, proc_cgroup=proc_cgroup)
    assert cgroups.unavailable == {} and cgroups.moved == []
    [base] = set(cgroups.bases.values())
    assert base.parent == top
    assert (top / "cgroup.subtree_control").read_text() == "+pids +cpuset"
    assert not (group / LEAF).exists(), "nothing of the worker's own group moved"
