"""Plain-data tests of the sandbox helpers: pytest rewrite, spec validation, files, pumping."""

from __future__ import annotations

import os
import pwd
import struct
import subprocess
import time
from pathlib import Path

import pytest

from tangram_celery.errors import (
    SandboxEngineError,
    SandboxError,
    SandboxSpecError,
    TangramError,
)
from tangram_celery.sandbox import (
    ExecSpec,
    SandboxLimits,
    SandboxSetupError,
    make_backend,
    rewrite_parallelism,
)
from tangram_celery.sandbox.cgroups.files import own_group_dir
from tangram_celery.sandbox.cgroups.v1 import parse_mountinfo, parse_proc_cgroup
from tangram_celery.sandbox.output import CUT_MARKER, CappedBuffer, pump
from tangram_celery.sandbox.seccomp import build_filter
from tangram_celery.sandbox.validation import validate_files, validate_spec
from tangram_celery.sandbox.workdir import dir_usage, workdir_name, write_files

REWRITES = [
    ("pytest", 2, "pytest -n 2"),
    ("pytest -q tests/", 4, "pytest -n 4 -q tests/"),
    ("python -m pytest -x", 2, "python -m pytest -n 2 -x"),
    ("python3 -m pytest", 3, "python3 -m pytest -n 3"),
    ("/usr/bin/python3 -m pytest -q", 2, "/usr/bin/python3 -m pytest -n 2 -q"),
    ("python3.11 -m   pytest", 2, "python3.11 -m   pytest -n 2"),
    ("py.test -q", 2, "py.test -n 2 -q"),
    ("cd repo && pytest -q", 2, "cd repo && pytest -n 2 -q"),
    ("pip install -e . ; pytest", 2, "pip install -e . ; pytest -n 2"),
    ("FOO=1 BAR=x pytest tests", 2, "FOO=1 BAR=x pytest -n 2 tests"),
    ("pytest a; pytest b", 2, "pytest -n 2 a; pytest -n 2 b"),
    ("pytest | tee log", 2, "pytest -n 2 | tee log"),
    ("(pytest -q)", 2, "(pytest -n 2 -q)"),
    ("make\npytest", 2, "make\npytest -n 2"),
    # explicit worker counts and disabled xdist are left alone
    ("pytest -n 4", 2, "pytest -n 4"),
    ("pytest -n4 -q", 2, "pytest -n4 -q"),
    ("pytest -nauto", 2, "pytest -nauto"),
    ("pytest --numprocesses=3", 2, "pytest --numprocesses=3"),
    ("pytest --numprocesses 3", 2, "pytest --numprocesses 3"),
    ("python -m pytest -p no:xdist", 2, "python -m pytest -p no:xdist"),
    ("pytest -n 4; pytest b", 2, "pytest -n 4; pytest -n 2 b"),
    # not a pytest invocation
    ("echo pytest", 2, "echo pytest"),
    ("pip install pytest", 2, "pip install pytest"),
    ("pytest-benchmark run", 2, "pytest-benchmark run"),
    ("python -m pytest_plugin", 2, "python -m pytest_plugin"),
    ("python script.py", 2, "python script.py"),
    # one unit: unchanged
    ("pytest -q", 1, "pytest -q"),
]


@pytest.mark.parametrize(("command", "units", "expected"), REWRITES)
def test_rewrite_parallelism(command: str, units: int, expected: str) -> None:
    assert rewrite_parallelism(command, units) == expected


def test_rewrite_rejects_zero_units() -> None:
    with pytest.raises(ValueError):
        rewrite_parallelism("pytest", 0)


def spec(**overrides: object) -> ExecSpec:
    base: dict[str, object] = {
        "trajectory_id": "traj-1", "command": "true", "files": {}, "timeout_s": 5.0,
        "cores": (0,),
    }
    base.update(overrides)
    return ExecSpec(**base)  # type: ignore[arg-type]


LIMITS = SandboxLimits(file_size_mb=1, workdir_mb=2)
BAD_SPECS = [
    ({"files": {"/etc/passwd": "x"}}, "files['/etc/passwd']", "absolute"),
    ({"files": {"../escape.txt": "x"}}, "files['../escape.txt']", "'..'"),
    ({"files": {"a/../../b": "x"}}, "files['a/../../b']", "'..'"),
    ({"files": {"": "x"}}, "files['']", "non-empty"),
    ({"files": {"./": "x"}}, "files['./']", "work dir itself"),
    ({"files": {"a\x00b": "x"}}, "files['a\\x00b']", "NUL"),
    ({"files": {"big": "x" * (1024 * 1024 + 1)}}, "files['big']", "per-file limit"),
    ({"files": {f"f{i}": "x" * 800_000 for i in range(3)}}, "files", "work-dir quota"),
    ({"trajectory_id": "../../etc"}, "trajectory_id", "must match"),
    ({"trajectory_id": ""}, "trajectory_id", "must match"),
    ({"timeout_s": 0}, "timeout_s", "positive"),
    ({"timeout_s": float("inf")}, "timeout_s", "positive"),
    ({"cores": ()}, "cores", "non-empty"),
    ({"cores": (-1,)}, "cores", "non-negative"),
    ({"cores": (9999,)}, "cores", "not usable"),
    ({"cores": [0]}, "cores", "tuple"),
    ({"env": {"BAD-NAME": "x"}}, "env['BAD-NAME']", "names must match"),
    ({"env": {"OK": "a\x00b"}}, "env['OK']", "NUL"),
    ({"env": {"TANGRAM_UNITS": "0"}}, "env['TANGRAM_UNITS']", "positive integer"),
    ({"command": "echo \x00"}, "command", "NUL"),
    ({"command": "x" * 200_000}, "command", "files"),
    ({"stdin": "x" * (1024 * 1024 + 1)}, "stdin", "as a file"),
]


@pytest.mark.parametrize(("overrides", "field", "words"), BAD_SPECS)
def test_bad_spec_names_field(overrides: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(SandboxSpecError) as info:
        validate_spec(spec(**overrides), LIMITS, frozenset(os.sched_getaffinity(0)))
    assert info.value.field == field
    assert words in info.value.reason
    assert isinstance(info.value, SandboxError) and isinstance(info.value, TangramError)


def test_good_spec_passes_and_normalises_paths() -> None:
    files = validate_files({"./a//b.txt": "hi", "c": ""}, LIMITS)
    assert [(f.name, f.data) for f in files] == [("a/b.txt", b"hi"), ("c", b"")]
    validate_spec(spec(files={"src/x.py": "print(1)"}, env={"A_B": "1"}), LIMITS,
                  frozenset(os.sched_getaffinity(0)))


def test_bad_limits_name_the_field() -> None:
    with pytest.raises(SandboxSpecError) as info:
        SandboxLimits(memory_mb=0)
    assert info.value.field == "limits.memory_mb"


def test_workdir_name_is_safe_and_stable() -> None:
    name = workdir_name("traj:1.a-b")
    assert name == workdir_name("traj:1.a-b") and name != workdir_name("traj:1.a-c")
    assert name.startswith("t-") and all(c.isalnum() or c == "-" for c in name)
    with pytest.raises(SandboxSpecError):
        workdir_name("../x")


def test_write_files_never_follows_planted_symlinks(tmp_path: Path) -> None:
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    victim = outside / "victim.txt"
    victim.write_text("original")
    (work / "leaf").symlink_to(victim)           # a planted leaf symlink
    (work / "dir").symlink_to(outside)            # a planted directory symlink
    files = validate_files({"leaf": "new", "sub/deep/x.txt": "deep"}, LIMITS)
    write_files(work, files, os.getuid(), os.getgid())
    assert victim.read_text() == "original"
    assert (work / "leaf").read_text() == "new" and not (work / "leaf").is_symlink()
    assert (work / "sub/deep/x.txt").read_text() == "deep"
    with pytest.raises(SandboxSpecError) as info:
        write_files(work, validate_files({"dir/pwned": "x"}, LIMITS), os.getuid(), os.getgid())
    assert info.value.field == "files['dir/pwned']"
    assert not (outside / "pwned").exists()


def test_write_files_refuses_to_replace_a_directory(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    with pytest.raises(SandboxSpecError, match="is a directory"):
        write_files(tmp_path, validate_files({"d": "x"}, LIMITS), os.getuid(), os.getgid())


def test_dir_usage_counts_and_stops_early(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(os.urandom(64 * 1024))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(os.urandom(64 * 1024))
    (tmp_path / "link").symlink_to("/usr")
    total = dir_usage(tmp_path)
    assert 128 * 1024 <= total < 1024 * 1024
    assert dir_usage(tmp_path, stop_above=1000) > 1000
    assert dir_usage(tmp_path / "missing") == 0


def test_capped_buffer_keeps_head_and_tail() -> None:
    buf = CappedBuffer(5)
    for chunk in (b"hel", b"lo world", b"\xff"):
        buf.feed(chunk, 1.0)
    assert buf.text() == "he" + CUT_MARKER.format(cut=7) + "ld\ufffd"
    assert buf.truncated and buf.total == 12
    bad = CappedBuffer(10)
    bad.feed(b"\xff\xfeok", 0.0)
    assert bad.text() == "\ufffd\ufffdok"


def test_pump_caps_output_feeds_stdin_and_times_out() -> None:
    proc = subprocess.Popen(["/bin/sh", "-c", "cat; head -c 100000 /dev/zero >&2"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    out, err = CappedBuffer(1 << 20), CappedBuffer(10)
    assert pump(proc, {1: out, 2: err}, b"x" * 300_000, time.monotonic() + 20)
    assert proc.wait(5) == 0
    assert out.total == 300_000 and not out.truncated
    assert err.total == 100_000 and err.truncated and len(err.data) == 10
    proc.stdout.close()  # type: ignore[union-attr]
    proc.stderr.close()  # type: ignore[union-attr]
    slow = subprocess.Popen(["sleep", "5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    t0 = time.monotonic()
    assert not pump(slow, {1: CappedBuffer(1), 2: CappedBuffer(1)}, None, t0 + 0.3)
    assert time.monotonic() - t0 < 2
    slow.kill()
    slow.wait()
    slow.stdout.close()  # type: ignore[union-attr]
    slow.stderr.close()  # type: ignore[union-attr]


def test_seccomp_filter_shape() -> None:
    prog = build_filter("x86_64")
    assert len(prog) % 8 == 0 and 30 < len(prog) // 8 < 255
    first = struct.unpack("=HBBI", prog[:8])
    assert first == (0x20, 0, 0, 4)  # load the audit arch first
    assert build_filter("aarch64") != prog
    with pytest.raises(SandboxSetupError, match="seccomp=False"):
        build_filter("sparc")


def test_cgroup_parsers() -> None:
    mountinfo = (
        "34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n"
        "35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
    )
    mounts = parse_mountinfo(mountinfo)
    assert mounts == {"cpuset": (Path("/sys/fs/cgroup/cpuset"), "/"),
                      "memory": (Path("/sys/fs/cgroup/memory"), "/docker/abc")}
    own = parse_proc_cgroup("4:memory:/docker/abc/x\n3:cpuset:/\n0::/\n")
    assert own == {"memory": "/docker/abc/x", "cpuset": "/"}
    assert own_group_dir(Path("/m"), "/docker/abc", "/docker/abc/x") == Path("/m/x")
    assert own_group_dir(Path("/m"), "/", "/a/b") == Path("/m/a/b")


def test_make_backend_names(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with pytest.raises(SandboxEngineError, match="TANGRAM_SANDBOX_BACKEND=bwrap"):
        make_backend("docker", tmp_path, SandboxLimits(), uid_base=1_500_000, uid_count=10,
                     docker_url=f"unix://{tmp_path}/no-engine.sock")
    assert time.monotonic() - t0 < 5
    with pytest.raises(SandboxSetupError, match="unknown sandbox backend"):
        make_backend("chroot", tmp_path, SandboxLimits())


def test_missing_bubblewrap_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(SandboxSetupError, match="README"):
        make_backend("bwrap", tmp_path, SandboxLimits(), bwrap_path="/nonexistent/bwrap")


def test_untraversable_root_is_refused(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(SandboxSetupError, match="o\\+x"):
        make_backend("bwrap", private / "root", SandboxLimits())


def test_uid_ranges_overlapping_host_accounts_are_refused(tmp_path: Path) -> None:
    account = min(e.pw_uid for e in pwd.getpwall() if e.pw_uid > 0)
    with pytest.raises(SandboxSetupError, match="include host accounts"):
        make_backend("bwrap", tmp_path, SandboxLimits(), uid_base=account, uid_count=1)
    with pytest.raises(SandboxSetupError, match="non-root"):
        make_backend("bwrap", tmp_path, SandboxLimits(), uid_base=0)
