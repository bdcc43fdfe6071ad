"""Plain-data tests of the Docker backend's policy, configuration and wire protocol, and of the
image recipe's mirror lookup. No engine needed."""

from __future__ import annotations

import json
import socket
import struct
from pathlib import Path

import docker_engine
import pytest

from tangram_celery.errors import SandboxSetupError, SandboxSpecError
from tangram_celery.sandbox import ExecSpec, SandboxLimits
from tangram_celery.sandbox.docker.exchange import read_ahead
from tangram_celery.sandbox.docker.image import (
    customize_rootfs,
    debian_mirror,
    debootstrap_command,
    read_apt_sources,
)
from tangram_celery.sandbox.docker.options import (
    PIDS_OVERHEAD,
    container_options,
    cpu_options,
    seccomp_profile,
)
from tangram_celery.sandbox.docker.policy import (
    PoolPlan,
    WarmPoolPolicy,
    idle_expired,
    peak_arrivals,
    plan_pool,
    warm_pool_target,
)
from tangram_celery.sandbox.docker.protocol import (
    FrameDemuxer,
    command_start,
    exit_status,
    units_of,
)

POLICY = WarmPoolPolicy(min_size=1, max_size=8, window_s=60.0, headroom=2.0)

# (arrival times, now, creation time, expected target)
TARGETS = [
    ([], 100.0, 0.3, 1),                                  # idle: the floor
    ([10.0], 100.0, 0.3, 1),                              # outside the window
    ([50.0, 70.0, 90.0], 100.0, 0.3, 1),                  # slow trickle
    ([100.0 - i for i in range(60)], 100.0, 0.3, 1),      # 1/s, 0.3 s to create: 0.6 -> 1
    ([100.0 - i * 0.1 for i in range(600)], 100.0, 0.3, 6),  # 10/s steady: ceil(10*.3*2)=6
    ([99.0] * 5, 100.0, 0.3, 5),                          # a burst of 5 at once
    ([99.0] * 40, 100.0, 0.3, 8),                         # a big burst: the ceiling
    ([99.0, 99.5, 100.0], 100.0, 1.0, 3),                 # 3 within one creation time
    ([99.0, 99.5, 100.0], 100.0, 0.1, 1),                 # spread wider than a creation time
]


@pytest.mark.parametrize(("arrivals", "now", "create_s", "expected"), TARGETS)
def test_warm_pool_target(arrivals: list[float], now: float, create_s: float,
                          expected: int) -> None:
    assert warm_pool_target(arrivals, now, create_s, POLICY) == expected


def test_warm_pool_target_respects_the_floor_and_a_zero_ceiling() -> None:
    assert warm_pool_target([], 0.0, 0.3, WarmPoolPolicy(min_size=3, max_size=5)) == 3
    assert warm_pool_target([0.0] * 9, 0.0, 0.3, WarmPoolPolicy(min_size=0, max_size=0)) == 0


def test_warm_pool_policy_is_validated() -> None:
    with pytest.raises(SandboxSpecError, match="min_size"):
        WarmPoolPolicy(min_size=3, max_size=2)
    with pytest.raises(SandboxSpecError, match="positive"):
        WarmPoolPolicy(window_s=0)


@pytest.mark.parametrize(("times", "span", "expected"), [
    ([], 1.0, 0), ([1.0], 1.0, 1), ([1.0, 1.5, 2.0, 5.0], 1.0, 3),
    ([1.0, 2.1, 3.2], 1.0, 1), ([0.0, 0.0, 0.0], 0.0, 3),
])
def test_peak_arrivals(times: list[float], span: float, expected: int) -> None:
    assert peak_arrivals(times, span) == expected


@pytest.mark.parametrize(("ready", "creating", "target", "plan"), [
    (0, 0, 2, PoolPlan(create=2)),
    (1, 1, 2, PoolPlan()),
    (0, 1, 3, PoolPlan(create=2)),
    (4, 0, 1, PoolPlan(remove=3)),
    (2, 0, 2, PoolPlan()),
    (1, 3, 2, PoolPlan()),   # enough on the way: nothing to do
])
def test_plan_pool(ready: int, creating: int, target: int, plan: PoolPlan) -> None:
    assert plan_pool(ready, creating, target) == plan


def test_idle_expired_skips_busy_and_orders_oldest_first() -> None:
    last = {"a": 10.0, "b": 50.0, "c": 5.0, "d": 95.0}
    assert idle_expired(last, busy={"c"}, now=100.0, ttl_s=40.0) == ["a", "b"]
    assert idle_expired(last, busy=set(), now=100.0, ttl_s=1000.0) == []


# -- configuration ------------------------------------------------------------------------------


def test_container_options_isolate() -> None:
    limits = SandboxLimits(memory_mb=256, pids=64, workdir_mb=32, tmp_mb=16, file_size_mb=8,
                           cpu_time_s=30)
    opts = container_options(limits, {"k": "v"}, seccomp="{}", uid=1_500_007)
    assert opts["network_mode"] == "none" and opts["read_only"] is True
    assert opts["cap_drop"] == ["ALL"] and opts["cap_add"] == ["SETUID", "SETGID", "SETPCAP"]
    assert opts["security_opt"] == ["no-new-privileges", "seccomp={}"]
    assert opts["pids_limit"] == 64 + PIDS_OVERHEAD
    assert opts["mem_limit"] == opts["memswap_limit"] == (256 + 32 + 1) * 1024 * 1024
    assert opts["user"] == "0:0" and opts["init"] is True
    assert "size=16m" in opts["tmpfs"]["/tmp"]
    assert "mode=0700,uid=1500007,gid=1500007" in opts["tmpfs"]["/work"]
    assert opts["shm_size"] == 16 * 1024 * 1024
    assert opts["cpu_quota"] == 100_000  # one core while its executor starts, then throttled
    names = {u["Name"]: u["Soft"] for u in opts["ulimits"]}
    assert names == {"nofile": 256, "fsize": 8 << 20, "data": 256 << 20, "core": 0, "cpu": 30}
    assert "seccomp" not in " ".join(container_options(limits, {}, None, 1_500_007)["security_opt"])


def test_cpu_options_pin_and_quota() -> None:
    assert cpu_options((3, 1)) == {"cpuset_cpus": "1,3", "cpu_period": 100_000,
                                   "cpu_quota": 200_000}
    assert cpu_options((0, 0, 0))["cpu_quota"] == 100_000  # oversubscribed units share a CPU


def test_seccomp_profile_denies_the_embedded_list_and_namespaces() -> None:
    profile = json.loads(seccomp_profile("x86_64"))
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    assert profile["architectures"] == ["SCMP_ARCH_X86_64"]
    denied = set(profile["syscalls"][0]["names"])
    assert {"keyctl", "io_uring_setup", "bpf", "unshare", "mount", "setns"} <= denied
    vsock = [r for r in profile["syscalls"] if r["names"] == ["socket"]]
    assert vsock and vsock[0]["args"][0]["value"] == 40
    clone_flags = {r["args"][0]["value"] for r in profile["syscalls"] if r["names"] == ["clone"]}
    assert 0x10000000 in clone_flags  # CLONE_NEWUSER
    with pytest.raises(SandboxSetupError, match="seccomp=False"):
        seccomp_profile("sparc")


@pytest.mark.parametrize(("code", "timed_out", "expected"), [
    (0, False, (0, None)), (3, False, (3, None)), (137, False, (137, 9)),
    (143, False, (143, 15)), (137, True, (None, 9)), (None, False, (None, None)),
    (-1, False, (None, None)), (255, False, (255, None)),
])
def test_exit_status(code: int | None, timed_out: bool,
                     expected: tuple[int | None, int | None]) -> None:
    assert exit_status(code, timed_out=timed_out) == expected


def test_units_of() -> None:
    assert units_of(ExecSpec("t", "x", {}, 1.0, (0, 1))) == 2
    assert units_of(ExecSpec("t", "x", {}, 1.0, (0,), env={"TANGRAM_UNITS": "4"})) == 4


# -- wire protocol ------------------------------------------------------------------------------


def frame(stream: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(payload)) + payload


def test_demuxer_splits_frames_across_arbitrary_reads() -> None:
    data = frame(1, b"hello ") + frame(2, b"err") + frame(1, b"") + frame(1, b"world\x00\x01")
    for step in (1, 3, 7, len(data)):
        demux = FrameDemuxer()
        pieces: list[tuple[int, bytes]] = []
        for i in range(0, len(data), step):
            pieces += demux.feed(data[i:i + step])
        joined = {s: b"".join(p for t, p in pieces if t == s) for s in (1, 2)}
        assert joined == {1: b"hello world\x00\x01", 2: b"err"}
        assert demux.pending() == b""


def test_demuxer_passes_raw_engine_errors_on() -> None:
    demux = FrameDemuxer()
    pieces = demux.feed(b"OCI runtime exec failed: exec failed: unable to start")
    assert demux.raw and b"".join(p for _, p in pieces).startswith(b"OCI runtime")
    assert {s for s, _ in pieces} == {3}


# (t0, start frame read at, end, the executor's elapsed or None, expected command start)
COMMAND_STARTS = [
    (0.0, 0.10, 0.50, 0.38, 0.10),   # marker on time: it stands
    (0.0, 0.25, 0.50, 0.30, 0.20),   # read late: the executor's clock moves the start back
    (0.0, 0.25, 0.50, None, 0.25),   # no end (the executor stuck): the start frame is all there is
    (0.0, None, 0.50, None, 0.50),   # never started: all setup
    (0.2, 0.30, 0.50, 0.40, 0.20),   # never before the action's own start
    (0.0, 0.60, 0.50, 0.00, 0.50),   # never after its end
]


@pytest.mark.parametrize(("t0", "marker", "end", "elapsed", "expected"), COMMAND_STARTS)
def test_command_start_trusts_the_executor_clock_over_a_late_frame(
    t0: float, marker: float | None, end: float, elapsed: float | None, expected: float
) -> None:
    assert command_start(t0, marker, end, elapsed) == pytest.approx(expected)


# -- the image recipe ---------------------------------------------------------------------------

DEB822 = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
"""


@pytest.mark.parametrize(("sources", "expected"), [
    ({"sources.list.d/debian.sources": DEB822}, "http://mirror.example/debian"),
    ({"sources.list": "deb [arch=amd64] http://a.example/debian bookworm main contrib\n"},
     "http://a.example/debian"),
    ({"sources.list": "# deb http://old.example/debian bookworm main\n"
                      "deb http://b.example/debian bookworm-updates main\n"
                      "deb http://c.example/debian bookworm main\n"}, "http://c.example/debian"),
    ({"sources.list.d/x.sources": "Types: deb\nURIs: http://off.example/\nSuites: bookworm\n"
                                  "Components: main\nEnabled: no\n",
      "sources.list.d/y.sources": DEB822}, "http://mirror.example/debian"),
    ({"sources.list.d/nodesource.sources": "Types: deb\nURIs: https://deb.node.example\n"
                                           "Suites: nodistro\nComponents: main\n",
      "sources.list": "deb http://d.example/debian bookworm main\n"}, "http://d.example/debian"),
])
def test_debian_mirror_comes_from_apt(sources: dict[str, str], expected: str) -> None:
    assert debian_mirror(sources) == expected


def test_debian_mirror_missing_says_what_to_do() -> None:
    with pytest.raises(SandboxSetupError, match="--mirror"):
        debian_mirror({"sources.list": "deb http://x.example/debian trixie main\n"})


def test_read_apt_sources_ignores_disabled_files(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "a.sources").write_text(DEB822)
    disabled = tmp_path / "sources.list.d" / "b.list.disabled-by-farm"
    disabled.write_text("deb http://no.example bookworm main")
    assert list(read_apt_sources(tmp_path)) == ["sources.list.d/a.sources"]
    assert debian_mirror(read_apt_sources(tmp_path)) == "http://mirror.example/debian"


def test_debootstrap_command_and_rootfs_customization(tmp_path: Path) -> None:
    argv = debootstrap_command(tmp_path, "http://m.example/debian")
    assert argv[:2] == ["debootstrap", "--variant=minbase"] and argv[-1] == "http://m.example/debian"
    assert "python3-pytest-xdist" in argv[2]
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (etc / "group").write_text("root:x:0:\n")
    (tmp_path / "usr/share/doc/pkg").mkdir(parents=True)
    customize_rootfs(tmp_path)
    customize_rootfs(tmp_path)  # idempotent
    assert (etc / "passwd").read_text().count("sandbox:x:1000:1000") == 1
    assert (tmp_path / "work").is_dir() and not (tmp_path / "usr/share/doc/pkg").exists()


# -- the exec socket ---------------------------------------------------------------------------


class _Raw:
    """Stands in for urllib3's response: ``raw._fp.fp`` is the buffered reader."""

    def __init__(self, reader: object) -> None:
        self._fp = type("Fp", (), {"fp": reader})()


def test_stream_bytes_buffered_with_the_http_headers_are_not_lost() -> None:
    ours, engine = socket.socketpair()
    try:
        engine.sendall(b"HTTP/1.1 101 UPGRADED\r\n\r\n" + frame(1, b"early output"))
        reader = ours.makefile("rb")
        assert reader.readline().startswith(b"HTTP/1.1 101")
        assert reader.readline() == b"\r\n"
        handle = type("Handle", (), {})()
        handle._response = type("Resp", (), {"raw": _Raw(reader)})()  # type: ignore[attr-defined]
        ours.setblocking(False)
        assert read_ahead(handle) == frame(1, b"early output")
        assert read_ahead(handle) == b""
    finally:
        ours.close()
        engine.close()


# -- the test engine helper ----------------------------------------------------------------------


def test_private_dockerd_leaves_the_firewall_and_forwarding_alone(tmp_path: Path) -> None:
    argv = docker_engine.dockerd_argv("/usr/sbin/dockerd", tmp_path, "overlay2")
    assert {"--iptables=false", "--ip-forward=false", "--bridge=none"} <= set(argv)
    for flag in ("--data-root", "--exec-root", "--pidfile", "--config-file", "--host"):
        assert any(a.startswith(flag) and str(tmp_path) in a for a in argv), flag


def test_forwarding_sysctls_are_put_back(tmp_path: Path) -> None:
    knob = tmp_path / "ip_forward"
    knob.write_text("1\n")
    docker_engine._restore_sysctls({str(knob): "0"})
    assert knob.read_text() == "0\n"


def test_missing_docker_io_fails_with_the_setup_command(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    monkeypatch.setattr(docker_engine.shutil, "which", lambda *a, **k: None)
    with pytest.raises(docker_engine.EngineUnavailable, match=r"scripts/run\.sh setup") as info:
        docker_engine.start_dockerd(tmp_path)
    assert info.value.kind == "setup"


def test_configured_engine_url() -> None:
    assert docker_engine.configured_url({}) == "unix:///var/run/docker.sock"
    assert docker_engine.configured_url({"DOCKER_HOST": "tcp://h:2375"}) == "tcp://h:2375"
    assert docker_engine.configured_url({"DOCKER_HOST": "tcp://h:2375",
                                         "TANGRAM_SANDBOX_DOCKER_URL": "unix:///s"}) == "unix:///s"
