"""Many hosts on real parts: four network namespaces, each with its own address and its own
private sandbox filesystem (see ``tests/hosts.py``), linked by one switch.

* host A: ``tangram redis`` bound to A's address with a password, and the training script (this
  test's thread, moved into A's network namespace);
* hosts B and C: one ``tangram worker cpu`` each;
* host D: ``tangram triton`` (the real tritonserver of nvidia-pytriton, on D's own loopback: only
  D's pool talks to it) and the GPU pool worker. **This machine has no GPU: the pool's GPU ids
  are simulated** (each id of a chunk is one CPU instance of the model on the real server).

No process reaches another host over 127.0.0.1: every connection to Redis comes from a host
address (checked in Redis's client list). Then C's link is cut mid-run: its waiting actions are
answered ``node_lost`` after ``TANGRAM_STRANDED_AFTER_S``, B and D go on, no action starts twice,
and C, once back, takes new trajectories.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from hosts import Host, network, on_host
from result_checks import check_act

from tangram_celery import keys
from tangram_celery.action import Action, ActionResult
from tangram_celery.client import TangramClient, code_action, command_action, test_run_action
from tangram_celery.pools.gpu_pool import reward_action, worker_name
from tangram_celery.pools.launch import wait_for_nodes, wait_for_worker
from tangram_celery.pools.registry import Registry
from tangram_celery.processes import stop_process
from tangram_celery.sandbox.workdir import workdir_name
from tangram_celery.settings import Settings
from tangram_celery.stack.broker import redis_answers
from tangram_celery.tasks.app import make_app

pytestmark = pytest.mark.slow

REPOSITORY = Path(__file__).resolve().parents[2] / "triton_models"
REDIS_PORT = 6390
TRITON_PORTS = (8000, 8001, 8002)
POOL = "mh"
NODES = {"b": "host-b", "c": "host-c"}
SKEWS = {"a": 0.2, "b": 0.35, "c": -0.3, "d": 0.25}
"""Each host's clock error (s), injected with the test-only TANGRAM_CLOCK_SKEW_S."""
TIMING = {"node_heartbeat_s": "0.5", "node_ttl_s": "3", "stranded_after_s": "4",
          "recovery_audit_s": "1", "trajectory_memory_mb": "256"}


@dataclass
class Cluster:
    """The four hosts, the settings every process reads, and the processes by host."""

    hosts: dict[str, Host]
    settings: Settings
    env: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]]
    logs: Path

    def spawn(self, host: str, argv: list[str], log: str) -> subprocess.Popen[bytes]:
        env = {**self.env, "TANGRAM_CLOCK_SKEW_S": str(SKEWS[host])}
        process = self.hosts[host].spawn([sys.executable, *argv], env, self.logs / log)
        self.procs[log] = process
        return process


def cpu_worker(cluster: Cluster, host: str) -> subprocess.Popen[bytes]:
    return cluster.spawn(host, ["-m", "tangram_celery.cli", "worker", "cpu", "--node",
                                NODES[host], "--cores", "1", "--memory-mb", "2048"],
                         f"{NODES[host]}.log")


@contextlib.contextmanager
def four_hosts(tmp_path: Path) -> Iterator[Cluster]:
    private = Path("/var/tmp") / f"tangram-mh-{uuid.uuid4().hex[:8]}"
    with network(["a", "b", "c", "d"], private) as hosts:
        url = f"redis://:mh-{uuid.uuid4().hex}@{hosts['a'].address}:{REDIS_PORT}/0"
        env = {"TANGRAM_REDIS_URL": url, "TANGRAM_SANDBOX_ROOT": str(private / "sandboxes"),
               **{f"TANGRAM_{k.upper()}": v for k, v in TIMING.items()}}
        settings = Settings.from_env(env, clock_skew_s=SKEWS["a"])
        cluster = Cluster(hosts, settings, env, {}, tmp_path)
        try:
            cluster.spawn("a", ["-m", "tangram_celery.cli", "redis", "--bind",
                                hosts["a"].address, "--dir", str(private / "redis")], "redis.log")
            with on_host(hosts["a"]):
                wait_until(lambda: redis_answers(url), 20)
            yield cluster
        finally:
            for process in reversed(list(cluster.procs.values())):
                stop_process(process, timeout=30)
            for log in sorted(tmp_path.glob("*.log")):
                text = log.read_text(errors="replace")
                if "Traceback" in text:
                    print(f"--- {log.name} ---\n{text[-4000:]}")


def start_pools(cluster: Cluster) -> str:
    """CPU nodes on B and C, tritonserver and the GPU pool on D; returns the pool's worker."""
    for host in NODES:
        cpu_worker(cluster, host)
    http, grpc, metrics = (str(p) for p in TRITON_PORTS)
    cluster.spawn("d", ["-m", "tangram_celery.cli", "triton", "--repository", str(REPOSITORY),
                        "--host", "127.0.0.1", "--http-port", http, "--grpc-port", grpc,
                        "--metrics-port", metrics, "--log", str(cluster.logs / "triton.out")],
                  "triton.log")
    cluster.env.update({"TANGRAM_TRITON_URL": f"127.0.0.1:{http}",
                        "TANGRAM_TRITON_REPOSITORY": str(REPOSITORY)})
    wait_until(lambda: "tritonserver ready" in (cluster.logs / "triton.log").read_text(), 120)
    pool = cluster.spawn("d", ["-m", "tangram_celery.pools.gpu_pool", "--pool", POOL,
                               "--gpus", "2"], "gpu-pool.log")
    name = worker_name(POOL, pool.pid)
    with on_host(cluster.hosts["a"]):
        nodes = registry(cluster.settings)
        wait_for_nodes(nodes, list(NODES.values()), timeout=60)
        wait_for_worker(make_app(cluster.settings), name, pool, timeout=120)
        isolation = {n.name: n.isolation for n in nodes.nodes()}
    assert all(isolation[n].startswith("enforced: cgroup") for n in NODES.values()), isolation
    return name


def registry(settings: Settings) -> Registry:
    return Registry(redis.Redis.from_url(settings.broker.redis_url), settings.node.ttl_s,
                    settings.actions.trajectory_ttl_s)


def wait_until(condition: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if condition():  # type: ignore[operator]
                return
        time.sleep(0.1)
    raise AssertionError(f"condition not met in {timeout} s")


def trajectory_actions(tid: str) -> list[Action]:
    """A code action that leaves a file in the trajectory's environment, a test run that
    reads it, and a reward for the trajectory's answer. A node runs the actions it holds as
    cores allow, so the test run is submitted once the code action has answered (as an agent
    would), not beside it."""
    tests = f"def test_secret():\n    assert open('secret.txt').read() == '{tid}'\n"
    return [
        code_action(tid, f"open('secret.txt', 'w').write('{tid}')\nprint('{tid}')"),
        test_run_action(tid, "python3 -m pytest -q -p no:cacheprovider test_s.py", cpu=1,
                        files={"test_s.py": tests}),
        reward_action(tid, "answer_match", {"response": "\\boxed{42}", "reference": "42"},
                      pool=POOL),
    ]


def sandbox_dirs(process: subprocess.Popen[bytes], root: Path) -> set[str]:
    """What ``process`` sees under ``root`` through its own mount namespace: the trajectory
    work dirs, as ``node/work-dir-name``."""
    seen = Path(f"/proc/{process.pid}/root") / root.relative_to("/")
    return {f"{node.name}/{work.name}" for node in seen.iterdir()
            for work in node.glob("inst-*/t-*")}


def check_clients_are_hosts(cluster: Cluster, raw: redis.Redis) -> set[str]:
    """Every connection to Redis comes from a host's address; returns those addresses."""
    addresses = {c["addr"].rsplit(":", 1)[0] for c in raw.client_list()}
    hosts = {h.address for h in cluster.hosts.values()}
    assert addresses <= hosts, f"connections from outside the hosts: {addresses - hosts}"
    return addresses


def check_clock(result: ActionResult, skew: float) -> None:
    """The worker measured its clock's skew from the broker's (Redis on A has none)."""
    timings = result.timings
    assert 0 <= timings.clock_error_s < 0.05, timings
    assert timings.clock_offset_s == pytest.approx(skew, abs=timings.clock_error_s + 0.005)


def per_node(results: list[ActionResult]) -> dict[str, int]:
    return dict(Counter(r.node for r in results))


def run_batch_on_every_host(cluster: Cluster, client: TangramClient, raw: redis.Redis,
                            gpu_node: str) -> list[ActionResult]:
    tids = [f"mh-{i}" for i in range(6)]
    steps = [trajectory_actions(tid) for tid in tids]
    results = client.run_batch([first for first, *_ in steps], timeout=300)
    results += client.run_batch([a for _, *rest in steps for a in rest], timeout=300)
    hosts = {"host-b": "b", "host-c": "c", gpu_node: "d"}
    for result in results:
        assert result.ok, (result.action_id, result.status, result.error, result.output)
        check_act(result, slack=result.timings.clock_error_s + client.clock.offset().error_s)
        check_clock(result, SKEWS[hosts[result.node]])
    placed = {tid: {r.node for r in results if r.trajectory_id == tid and r.kind != "reward"}
              for tid in tids}
    assert all(len(nodes) == 1 for nodes in placed.values()), placed
    counts = Counter(next(iter(nodes)) for nodes in placed.values())
    assert counts == {"host-b": 3, "host-c": 3}, f"not balanced by memory: {counts}"
    views = {v.name: v for v in registry(cluster.settings).nodes()}
    assert {views[n].reserved_mb for n in NODES.values()} == {3 * 256}
    assert {r.node for r in results if r.kind == "reward"} == {gpu_node}
    assert all(r.output["reward"] == 1.0 for r in results if r.kind == "reward")
    root = cluster.settings.sandbox.root
    seen = {h: sandbox_dirs(cluster.procs[f"{n}.log"], root) for h, n in NODES.items()}
    for host, node in NODES.items():
        mine = {f"{node}/{workdir_name(t)}" for t, nodes in placed.items() if nodes == {node}}
        assert seen[host] == mine, (host, seen[host], mine)
    assert not root.exists() or not any(root.iterdir()), "a host wrote into the shared root"
    assert check_clients_are_hosts(cluster, raw) == {h.address for h in cluster.hosts.values()}
    for tid in tids:
        client.end_trajectory(tid)
    return results


def cut_c_mid_run(cluster: Cluster, client: TangramClient
                  ) -> tuple[list[ActionResult], dict[str, float]]:
    actions = [command_action(f"cut-{t}", f"sleep 0.4; echo cut-{t}-{k}", id=f"cut-{t}-{k}")
               for t in range(6) for k in range(3)]
    actions += [reward_action(f"cut-{t}", "answer_match", {"response": "7", "reference": "7"},
                              pool=POOL, id=f"cut-{t}-r") for t in range(6)]
    handles = client.submit_many(actions)
    on_c = [h for h in handles if h.queue == keys.cpu_queue(NODES["c"])]
    assert on_c, "no trajectory went to C"
    raw = redis.Redis.from_url(cluster.settings.broker.redis_url)
    wait_until(lambda: raw.get(keys.action_result(on_c[0].id)) is not None, 120)
    cluster.hosts["c"].cut()
    cut_at = time.monotonic()
    results = [h.result(timeout=180) for h in handles]
    answered_s = time.monotonic() - cut_at
    cluster.hosts["c"].restore()
    return results, {"cut_to_last_answer_s": answered_s}


def test_four_hosts_with_one_lost_mid_run(tmp_path: Path) -> None:
    with four_hosts(tmp_path) as cluster:
        gpu_node = start_pools(cluster)
        with on_host(cluster.hosts["a"]), TangramClient(cluster.settings) as client:
            raw = redis.Redis.from_url(cluster.settings.broker.redis_url)
            first = run_batch_on_every_host(cluster, client, raw, gpu_node)
            second, timing = cut_c_mid_run(cluster, client)
            lost = [r for r in second if r.status == "node_lost"]
            assert lost and {r.node for r in lost} == {NODES["c"]}
            assert all("node_lost" in r.error for r in lost)
            for answer in lost:
                stored = json.loads(raw.get(keys.action_result(answer.action_id)) or b"{}")
                assert 4 <= stored["act"]["total"] < 180, stored
            for result in second:
                assert result.status in {"ok", "node_lost"}, (result.action_id, result.error)
                if result.ok and result.kind != "reward":
                    assert result.output["stdout"] == f"{result.action_id}\n"
                    check_act(result, slack=result.timings.clock_error_s
                              + client.clock.offset().error_s)
            assert all(r.ok for r in second if r.node != NODES["c"])
            wait_until(lambda: NODES["c"] in {v.name for v in
                                              registry(cluster.settings).nodes() if v.alive}, 120)
            third = client.run_batch([code_action(f"back-{i}", "print('back')")
                                      for i in range(4)], timeout=180)
            assert all(r.ok for r in third), [(r.status, r.error) for r in third]
            assert NODES["c"] in {r.node for r in third}, "C took no new trajectory"
            everything = first + second + third
            attempts = [int(raw.get(keys.action_attempts(r.action_id)) or 0)
                        for r in everything]
            report = {
                "actions": len(everything),
                "per_host": per_node([r for r in everything if r.status != "node_lost"]),
                "node_lost": len(lost),
                "reruns": sum(a > 1 for a in attempts),
                "answers": len({r.action_id for r in everything}),
                "late_results_discarded": int(raw.get(keys.DUPLICATE_RESULTS) or 0),
                **timing,
            }
        print(f"multi-host run: {json.dumps(report)}")
        assert report["answers"] == report["actions"], "an action was answered twice or lost"
        assert report["reruns"] == 0, "an action started twice"
        assert not [a for r, a in zip(everything, attempts, strict=True)
                    if r.status == "node_lost" and a > 1]
