"""The docker backend's resident executor without an engine: its wire (framed on both sides),
the node's link over a socket that plays the engine, its file writer against symlinks, and how
the node finds a container's cgroup files."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from tangram_celery.errors import SandboxSpecError, WorkdirQuotaError
from tangram_celery.sandbox import SandboxLimits
from tangram_celery.sandbox.docker import resident
from tangram_celery.sandbox.docker.cpu import cgroup_files
from tangram_celery.sandbox.docker.link import (
    End,
    Frames,
    Request,
    Resident,
    ResidentLost,
    Stamps,
    end_of,
    file_error,
)
from tangram_celery.sandbox.docker.protocol import Broken
from tangram_celery.sandbox.output import CappedBuffer
from tangram_celery.sandbox.validation import validate_files

CID = "59a590937f39636e6fcad40d140570eec273f9fcc11ca3b96c77715ee2199069"


def docker_frame(stream: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(payload)) + payload


def rframe(kind: bytes, payload: bytes = b"") -> bytes:
    return resident.FRAME.pack(kind, len(payload)) + payload


def test_frames_are_split_across_arbitrary_reads() -> None:
    data = rframe(b"O", b"out\x1etangram-end 0\x1e") + rframe(b"S") + rframe(b"X", b"{}")
    for step in (1, 2, 5, len(data)):
        frames = Frames()
        got: list[tuple[bytes, bytes]] = []
        for i in range(0, len(data), step):
            got += frames.feed(data[i:i + step])
        assert got == [(b"O", b"out\x1etangram-end 0\x1e"), (b"S", b""), (b"X", b"{}")]


def test_a_request_carries_its_files_then_its_stdin() -> None:
    files = validate_files({"a/b.txt": "hello", "c": "!"}, SandboxLimits())
    wire = Request(["/bin/sh", "-c", "cat"], {"K": "v"}, "/work", 2.5, files, b"IN").encode(7)
    (size,) = resident.REQUEST.unpack(wire[:4])
    header = json.loads(wire[4:4 + size])
    assert header["id"] == 7 and header["argv"] == ["/bin/sh", "-c", "cat"]
    assert header["files"] == [[["a", "b.txt"], 5], [["c"], 1]] and header["stdin"] == 2
    assert wire[4 + size:] == b"hello!IN"
    plain = Request(["x"], {}, "/work", 1.0, [], None).encode(1)
    assert json.loads(plain[4:])["stdin"] is None


@pytest.mark.parametrize(("status", "code"), [
    (0, 0), (3 << 8, 3), (255 << 8, 255), (9, 137), (15, 143), (None, None),
])
def test_the_end_reads_a_wait_status_in_the_shell_convention(
    status: int | None, code: int | None
) -> None:
    assert End(status, False, 0.0, 0, 0, None).exit_code == code


def test_the_end_frame_gives_oom_kills_and_work_dir_use() -> None:
    end = end_of(json.dumps({"status": 0, "timed_out": False, "elapsed_s": 0.5, "oom": 3,
                             "workdir": [100, 60, 4096]}).encode(), oom_before=2)
    assert end.oom_after > end.oom_before and end.workdir_bytes == 40 * 4096
    assert end_of(b'{"status": 0, "workdir": null}', 0).workdir_bytes is None


def test_file_errors_name_the_file() -> None:
    spec = file_error(json.dumps(["spec", "files['a']", "bad"]).encode())
    assert isinstance(spec, SandboxSpecError) and spec.field == "files['a']"
    assert isinstance(file_error(json.dumps(["quota", "files['a']", "full"]).encode()),
                      WorkdirQuotaError)
    assert isinstance(file_error(b"not json"), SandboxSpecError)


class FakeEngine:
    """The engine's end of an exec socket, speaking for a resident: the frames it is given."""

    def __init__(self, replies: list[bytes], close: bool = False) -> None:
        self.ours, self.theirs = socket.socketpair()
        self.replies, self.close = replies, close
        self.received = b""
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        self.theirs.settimeout(5)
        self.received = self.theirs.recv(1 << 16)
        for reply in self.replies:
            self.theirs.sendall(docker_frame(1, reply))
        if self.close:
            self.theirs.close()

    def link(self) -> Resident:
        self.ours.setblocking(False)
        self.thread.start()
        return Resident(self.ours, self.ours, docker_frame(1, rframe(b"R", b'{"pid": 9}')))


def test_the_link_forwards_output_and_returns_the_end() -> None:
    end = {"status": 1 << 8, "timed_out": False, "elapsed_s": 0.1, "oom": 0, "workdir": None}
    engine = FakeEngine([rframe(b"K", b'{"oom": 0}'), rframe(b"S"), rframe(b"O", b"out"),
                         rframe(b"E", b"err"), rframe(b"X", json.dumps(end).encode())])
    link = engine.link()
    stdout, stderr, stamps = CappedBuffer(100), CappedBuffer(100), Stamps()
    got = link.run(Request(["true"], {}, "/work", 1.0, [], None), stdout, stderr, stamps,
                   lambda: time.monotonic() + 5)
    assert got is not None and got.exit_code == 1 and stamps.started is not None
    assert bytes(stdout.data) == b"out" and bytes(stderr.data) == b"err"
    assert engine.received.startswith(resident.REQUEST.pack(len(engine.received) - 4))
    link.close()


def test_the_link_tells_a_broken_container_from_a_lost_action() -> None:
    for replies, error in (([rframe(b"B", b"pid cap exhausted: 68 of 68 in use")], Broken),
                           ([], Broken), ([rframe(b"K", b"{}"), rframe(b"S")], ResidentLost)):
        engine = FakeEngine(replies, close=True)
        link = engine.link()
        with pytest.raises(error):
            link.run(Request(["true"], {}, "/work", 1.0, [], None), CappedBuffer(9),
                     CappedBuffer(9), Stamps(), lambda: time.monotonic() + 5)
        link.close()


def test_the_link_gives_up_at_the_deadline() -> None:
    engine = FakeEngine([rframe(b"K", b"{}"), rframe(b"S")])
    link = engine.link()
    t0 = time.monotonic()
    got = link.run(Request(["true"], {}, "/work", 1.0, [], None), CappedBuffer(9),
                   CappedBuffer(9), Stamps(), lambda: t0 + 0.3)
    assert got is None and 0.25 < time.monotonic() - t0 < 3
    link.close()
    engine.theirs.close()


def test_the_file_writer_never_follows_a_symlink(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "link").symlink_to(tmp_path / "outside")
    (work / "d").mkdir()
    (work / "d" / "up").symlink_to(tmp_path)
    files = validate_files({"a/b.txt": "hello", "link": "replaced", "e.bin": "\udcff"},
                           SandboxLimits())
    header = [[list(f.parts), len(f.data)] for f in files]
    assert resident.write_files(str(work), header, memoryview(b"".join(f.data for f in files))) \
        is None
    assert (work / "a" / "b.txt").read_text() == "hello"
    assert not (work / "link").is_symlink() and (work / "link").read_text() == "replaced"
    assert (work / "e.bin").read_bytes() == b"\xff" and not (tmp_path / "outside").exists()
    failure = resident.write_files(str(work), [[["d", "up", "x"], 1]], memoryview(b"P"))
    assert failure is not None and failure[:2] == ["spec", "files['d/up/x']"]
    assert not (tmp_path / "x").exists()


V1_MOUNTS = """\
30 25 0:26 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
31 25 0:27 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
"""
V2_MOUNTS = "30 25 0:26 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw\n"

# (the container init's /proc/PID/cgroup, the node's mountinfo, expected files or None)
CGROUPS = [
    (f"4:cpuset:/docker/{CID}\n3:cpu:/docker/{CID}\n", V1_MOUNTS,
     (f"/sys/fs/cgroup/cpuset/docker/{CID}/cpuset.cpus",
      f"/sys/fs/cgroup/cpu/docker/{CID}/cpu.cfs_quota_us", False)),
    (f"0::/system.slice/docker-{CID}.scope\n", V2_MOUNTS,
     (f"/sys/fs/cgroup/system.slice/docker-{CID}.scope/cpuset.cpus",
      f"/sys/fs/cgroup/system.slice/docker-{CID}.scope/cpu.max", True)),
    ("4:cpuset:/docker/another\n3:cpu:/docker/another\n", V1_MOUNTS, None),  # not ours
    (f"0::/docker/{CID}\n", V1_MOUNTS, None),            # no cgroup2 mount seen by the node
    ("0::/\n", V2_MOUNTS, None),                          # the node sees another cgroup ns
]


@pytest.mark.parametrize(("proc", "mounts", "expected"), CGROUPS)
def test_a_containers_cgroup_files_are_found_only_when_they_are_its_own(
    proc: str, mounts: str, expected: tuple[str, str, bool] | None
) -> None:
    found = cgroup_files(CID, proc, mounts)
    assert (None if found is None else (str(found[0]), str(found[1]), found[2])) == expected
