"""What the Docker backend must do for honest actions, against a real engine: a container per
trajectory with its state, cores pinned before each exec, a warm pool, idle expiry, broken
containers replaced, and clear errors when the engine or the image is missing."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import docker
import pytest

from tangram_celery.errors import SandboxEngineError, SandboxError, SandboxSetupError
from tangram_celery.sandbox import (
    ExecOutcome,
    ExecSpec,
    SandboxBackend,
    SandboxLimits,
    SandboxSpecError,
    make_backend,
)
from tangram_celery.sandbox.docker import DockerBackend, DockerExecOutcome, WarmPoolPolicy
from tangram_celery.sandbox.docker.image import DEFAULT_TAG
from tangram_celery.sandbox.docker.options import IDLE_CPU_QUOTA_US
from tangram_celery.sandbox.docker.pool import LABEL_HOST, LABEL_OWNER, OWNER_PREFIX

pytestmark = pytest.mark.slow

SMALL = SandboxLimits(memory_mb=256, pids=64, file_size_mb=8, workdir_mb=32, tmp_mb=16,
                      nofile=128, output_cap_bytes=4096)
Make = Callable[..., DockerBackend]


@pytest.fixture()
def make_docker(docker_url: str, sandbox_root: Path) -> Iterator[Make]:
    """``make_docker(**options)``: a fresh backend (no warm pool unless asked), closed after."""
    made: list[DockerBackend] = []

    def make(**options: Any) -> DockerBackend:
        options.setdefault("warm_pool", WarmPoolPolicy(min_size=0, max_size=0))
        backend = DockerBackend(sandbox_root, SMALL, docker_url=docker_url, **options)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


@pytest.fixture()
def dock(docker_backend: DockerBackend) -> Iterator[DockerBackend]:
    """The session's Docker backend; the test's trajectories end with it."""
    yield docker_backend
    for trajectory_id in docker_backend.trajectories():
        docker_backend.end_trajectory(trajectory_id)


def go(backend: SandboxBackend, command: str, tid: str = "d1", **kw: Any) -> DockerExecOutcome:
    """Run ``command`` in ``backend`` (cores (0,), 20 s, no files unless given)."""
    kw.setdefault("files", {})
    kw.setdefault("timeout_s", 20.0)
    kw.setdefault("cores", (0,))
    outcome = backend.run(ExecSpec(tid, command, **kw))
    assert isinstance(outcome, DockerExecOutcome)
    return outcome


def container_of(backend: DockerBackend, tid: str) -> Any:
    """The container that holds trajectory ``tid`` (its hostname is the container id)."""
    short = go(backend, "cat /etc/hostname", tid).stdout.strip()
    return backend.client.containers.get(short)


def wait_until(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``check`` until it holds or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


# -- the interface ------------------------------------------------------------------------------


def test_make_backend_builds_it_and_drops_embedded_options(
    docker_url: str, sandbox_root: Path
) -> None:
    backend = make_backend("docker", sandbox_root, SMALL, docker_url=docker_url,
                           uid_base=1_500_000, uid_count=65536,
                           warm_pool=WarmPoolPolicy(min_size=0, max_size=0))
    try:
        assert isinstance(backend, DockerBackend) and isinstance(backend, SandboxBackend)
        assert backend.name == "docker" and backend.image == DEFAULT_TAG
        assert go(backend, "echo ok").stdout == "ok\n"
    finally:
        backend.close()


def test_exit_codes_signals_stdin_env_and_timings(dock: DockerBackend) -> None:
    assert go(dock, "exit 3").exit_code == 3
    killed = go(dock, "kill -9 $$")
    assert (killed.exit_code, killed.signal, killed.timed_out, killed.stderr) == (137, 9, False, "")
    assert go(dock, "tr a-z A-Z", stdin="hello").stdout == "HELLO"
    assert go(dock, "cat").stdout == ""
    env = go(dock, "echo $TANGRAM_UNITS $MY_FLAG $HOME $USER $(id -u)", env={"MY_FLAG": "on"})
    assert env.stdout.startswith("1 on /work sandbox ")
    assert int(env.stdout.split()[-1]) in dock.uids
    timed = go(dock, "sleep 0.3")
    assert timed.exec_s >= 0.3 and 0 < timed.setup_s < 5
    assert timed.started_at <= timed.finished_at
    late = go(dock, "sleep 5", timeout_s=0.5)
    assert late.timed_out and late.signal == 9 and late.exec_s < 3


def test_cores_are_pinned_before_each_exec(dock: DockerBackend,
                                           two_cores: tuple[int, int]) -> None:
    first, second = two_cores
    read = ("grep Cpus_allowed_list /proc/self/status | cut -f2; "
            "cat /sys/fs/cgroup/cpuset/cpuset.cpus /sys/fs/cgroup/cpuset.cpus 2>/dev/null; "
            "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null || "
            "cut -d' ' -f1 /sys/fs/cgroup/cpu.max; echo $TANGRAM_UNITS; nproc")
    assert go(dock, read, "pin", cores=(second,)).stdout.split() == [
        str(second), str(second), "100000", "1", "1"]
    both = go(dock, read, "pin", cores=(first, second)).stdout.split()
    assert both[0] == both[1] and both[0] in (f"{first}-{second}", f"{first},{second}")
    assert both[2:] == ["200000", "2", "2"]
    again = go(dock, read, "pin", cores=(first,)).stdout.split()
    assert again == [str(first), str(first), "100000", "1", "1"]
    container = container_of(dock, "pin")
    quota = ("cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null || "
             "cut -d' ' -f1 /sys/fs/cgroup/cpu.max")

    def throttled() -> bool:
        seen = container.exec_run(["sh", "-c", quota], user="0:0").output.decode().strip()
        return seen == str(IDLE_CPU_QUOTA_US)

    assert wait_until(throttled), "the container kept its cores after the action"


def test_pytest_is_told_its_workers(dock: DockerBackend, two_cores: tuple[int, int]) -> None:
    tests = "\n".join(
        f"def test_{i}():\n    import os\n    assert os.environ['PYTEST_XDIST_WORKER']\n"
        for i in range(4)
    )
    out = go(dock, "python3 -m pytest -q -p no:cacheprovider test_w.py", "xd",
             files={"test_w.py": tests}, cores=two_cores, timeout_s=60)
    assert out.exit_code == 0, out.stdout + out.stderr
    assert "4 passed" in out.stdout


# -- one container per trajectory ---------------------------------------------------------------


def test_state_persists_within_a_trajectory_and_ends_with_it(dock: DockerBackend) -> None:
    first = go(dock, "cat src/a.txt; echo made > note.txt; echo t > /tmp/t; cat /etc/hostname",
               "p1", files={"src/a.txt": "from spec\n"})
    assert first.exit_code == 0 and first.stdout.startswith("from spec\n")
    host = first.stdout.split()[-1]
    second = go(dock, "cat note.txt src/a.txt /tmp/t /etc/hostname; pwd", "p1")
    assert second.stdout == f"made\nfrom spec\nt\n{host}\n/work\n"
    other = go(dock, "ls -A; cat /etc/hostname", "p2").stdout.split()
    assert len(other) == 1 and other[0] != host  # a different, empty container
    assert set(dock.trajectories()) == {"p1", "p2"}
    dock.end_trajectory("p1")
    dock.end_trajectory("p1")  # idempotent
    assert dock.trajectories() == ["p2"]
    assert wait_until(lambda: host not in {c[:12] for c in dock.containers()})
    again = go(dock, "ls -A", "p1")
    assert again.stdout == "" and not again.environment_replaced


def test_large_and_nested_files_round_trip(dock: DockerBackend) -> None:
    blob = "".join(chr(32 + i % 90) for i in range(5 << 20))
    out = go(dock, "sha256sum big/nested/blob.txt | cut -d' ' -f1; cat x/y/z.txt", "files",
             files={"big/nested/blob.txt": blob, "x/y/z.txt": "zz"}, timeout_s=60)
    expected = subprocess.run(["sha256sum"], input=blob.encode(), capture_output=True,
                              check=True).stdout.split()[0].decode()
    assert out.stdout.split() == [expected, "zz"]
    with pytest.raises(SandboxSpecError, match="is a directory"):
        go(dock, "true", "files", files={"big/nested": "not a dir"})


def test_concurrent_trajectories_from_threads(dock: DockerBackend) -> None:
    def job(i: int) -> str:
        outputs = [go(dock, f"echo {i}-{k} > f; cat f", f"conc-{i}").stdout for k in range(3)]
        return ",".join(o.strip() for o in outputs)

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(job, range(4)))
    assert results == [f"{i}-0,{i}-1,{i}-2" for i in range(4)]


def test_end_trajectory_kills_a_running_action(dock: DockerBackend) -> None:
    outcome: list[object] = []

    def long_action() -> None:
        try:
            outcome.append(go(dock, "sleep 30", "doomed", timeout_s=60))
        except SandboxError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=long_action)
    thread.start()
    time.sleep(1.0)
    t0 = time.monotonic()
    dock.end_trajectory("doomed")
    thread.join(15)
    assert not thread.is_alive() and time.monotonic() - t0 < 10
    assert isinstance(outcome[0], SandboxError), outcome
    assert dock.trajectories() == []


def test_a_killed_wrapper_leaves_nothing_running(dock: DockerBackend, token: str,
                                                 assert_gone: Callable[[str], None]) -> None:
    out = go(dock, f"(setsid sh -c 'sleep 300; : {token}' </dev/null >/dev/null 2>&1 &); "
                   "read -r _ _ _ wrapper _ < /proc/$PPID/stat; kill -9 $wrapper; sleep 1",
             "orphan")
    assert out.exit_code == 137 and not out.timed_out
    assert_gone(token)
    assert go(dock, "echo alive", "orphan").stdout == "alive\n"


# -- the warm pool and idle expiry --------------------------------------------------------------


def test_warm_pool_serves_first_actions_and_follows_bursts(make_docker: Make) -> None:
    backend = make_docker(warm_pool=WarmPoolPolicy(min_size=1, max_size=3), tick_s=0.1)
    assert wait_until(lambda: backend.pool_size() == 1), "the pool never filled"
    ready = {c[:12] for c in backend.containers()}
    served = go(backend, "cat /etc/hostname", "w1")
    assert served.stdout.strip() in ready, "the first action did not get the warm container"
    assert wait_until(lambda: backend.pool_size() == 1), "the pool was not refilled"
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda i: go(backend, "true", f"burst-{i}"), range(4)))
    assert wait_until(lambda: backend.pool_size() == 3), (
        f"a burst of 4 starts left the pool at {backend.pool_size()}, not its ceiling 3")


def test_idle_trajectories_lose_their_container(make_docker: Make) -> None:
    backend = make_docker(idle_ttl_s=0.5, tick_s=0.1)
    go(backend, "echo x > f", "idle")
    assert backend.trajectories() == ["idle"]
    assert wait_until(lambda: backend.trajectories() == [], timeout=5)
    assert wait_until(lambda: backend.containers() == [], timeout=5)


# -- broken containers --------------------------------------------------------------------------


def assert_replaced(backend: DockerBackend, tid: str, why: str = "") -> None:
    out = go(backend, "ls -A; echo RAN", tid)
    assert out.stdout == "RAN\n", "the replacement container is not a fresh one"
    assert out.environment_replaced and out.replaced_reason, out
    assert why in out.replaced_reason, out.replaced_reason
    assert not go(backend, "true", tid).environment_replaced


def test_a_killed_container_is_replaced_and_the_action_says_so(dock: DockerBackend) -> None:
    go(dock, "echo state > f", "gone")
    container_of(dock, "gone").kill()
    assert_replaced(dock, "gone")


def test_a_paused_container_is_replaced(dock: DockerBackend) -> None:
    go(dock, "echo state > f", "paused")
    container_of(dock, "paused").pause()
    assert_replaced(dock, "paused", "paused")


def test_an_exhausted_pid_cap_gets_a_fresh_container(dock: DockerBackend) -> None:
    go(dock, "echo state > f", "pids")
    container = container_of(dock, "pids")
    # processes the sandbox uid cannot kill (another uid), holding every pid of the cap
    container.exec_run(["sh", "-c", "for i in $(seq 100); do sleep 300 & done; wait"],
                       user="65534:65534", workdir="/", detach=True)

    def full() -> bool:
        pids = container.stats(stream=False, one_shot=True).get("pids_stats", {})
        return int(pids.get("current", 0)) >= int(pids.get("limit", 1 << 30)) - 2

    assert wait_until(full, timeout=20), "could not fill the container's pid cap"
    assert_replaced(dock, "pids", "pid cap")


def test_a_stuck_exec_hits_the_client_deadline(make_docker: Make) -> None:
    backend = make_docker(grace_s=1.0)
    go(backend, "echo state > f", "stuck")
    container = container_of(backend, "stuck")
    threading.Timer(0.5, container.pause).start()
    t0 = time.monotonic()
    out = go(backend, "sleep 30", "stuck", timeout_s=1.0)
    assert out.timed_out and out.signal == 9 and time.monotonic() - t0 < 6
    assert_replaced(backend, "stuck", "did not end")


# -- setup errors -------------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("url", ["unix:///nonexistent/docker.sock", "tcp://127.0.0.1:{port}"])
def test_no_engine_fails_fast_and_says_what_to_do(sandbox_root: Path, url: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(SandboxEngineError, match="TANGRAM_SANDBOX_BACKEND=bwrap"):
        DockerBackend(sandbox_root, SMALL, docker_url=url.format(port=_closed_port()),
                      api_timeout_s=3)
    assert time.monotonic() - t0 < 8


def test_a_missing_image_says_how_to_build_it(docker_url: str, sandbox_root: Path) -> None:
    with pytest.raises(SandboxSetupError, match=r"build-sandbox-image\.sh"):
        DockerBackend(sandbox_root, SMALL, docker_url=docker_url, image="tangram-sandbox:nope")


def test_containers_of_dead_workers_are_reaped(docker_url: str, make_docker: Make) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    pidns = os.stat("/proc/self/ns/pid").st_ino
    client = docker.DockerClient(base_url=docker_url, timeout=30)
    try:
        orphan = client.containers.run(DEFAULT_TAG, ["sleep", "infinity"], detach=True,
                                       network_mode="none", labels={
                                           LABEL_OWNER: f"{OWNER_PREFIX}{pidns}-{dead.pid}-abcd",
                                           LABEL_HOST: socket.gethostname()})
        make_docker()
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(orphan.id)
    finally:
        client.close()


def test_close_removes_everything_and_refuses_new_work(make_docker: Make) -> None:
    backend = make_docker(warm_pool=WarmPoolPolicy(min_size=2, max_size=2), tick_s=0.1)
    go(backend, "true", "c1")
    assert wait_until(lambda: backend.pool_size() == 2)
    client = docker.DockerClient(base_url=backend.docker_url, timeout=30)
    owner = backend.owner
    backend.close()
    backend.close()
    try:
        left = client.containers.list(all=True, filters={"label": f"{LABEL_OWNER}={owner}"})
        assert left == []
    finally:
        client.close()
    with pytest.raises(SandboxError, match="closed"):
        backend.run(ExecSpec("c1", "true", {}, 10.0, (0,)))


def test_outcome_is_an_exec_outcome(dock: DockerBackend) -> None:
    assert isinstance(go(dock, "true"), ExecOutcome)
