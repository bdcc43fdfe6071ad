"""Redis failover under Sentinel on real parts, with nothing lost and nothing run twice.

Nine network namespaces on one switch (``tests/hosts.py``): the primary (P), its replica (R) and
three Sentinels (S1-S3), each on a host of its own; two CPU nodes (B, C); ``tangram triton`` and
the GPU pool (D; **no GPU here: its GPU ids are simulated**, each a CPU instance of the model on
the real tritonserver); and the training script (A, this test's thread). Every process reads
``TANGRAM_REDIS_URL=sentinel://...`` naming the Sentinels.

A batch of trajectories runs: sandboxed commands on the CPU nodes and reward calls on the GPU
pool. Once part of it is answered, P's host is killed (its link cut and redis-server
SIGKILLed), or in the other mode only partitioned (its link cut; it keeps running, alone, and
rejoins as a replica when the link is back). The Sentinels promote R and every part follows.

Checked for each run: every action is answered once (none lost, none answered twice: the
answer the client got is the one stored), none ran twice (each CPU command appends its id to
its trajectory's work dir, read through its node's mount namespace; Triton counts the reward
inferences it ran), results carry their ACT parts, and the batch finishes after the promotion.
Reported: the time from the kill to the first result stored on the new primary, and the writes
that the durability rules covered (results, claims, pins, tickets: ``WAIT`` for the replica).
Run with ``-s`` to see the per-run table.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
from hosts import Host, network, on_host
from result_checks import check_act

from tangram_celery import keys
from tangram_celery.action import Action, ActionResult
from tangram_celery.client import ActionHandle, TangramClient, command_action
from tangram_celery.connection import DURABILITY, connect
from tangram_celery.errors import ActionTimeout
from tangram_celery.pools.gpu_pool import reward_action, worker_name
from tangram_celery.pools.launch import wait_for_nodes, wait_for_worker
from tangram_celery.pools.registry import Registry
from tangram_celery.processes import stop_process
from tangram_celery.sandbox.workdir import workdir_name
from tangram_celery.settings import Settings
from tangram_celery.tasks.app import make_app

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sentinels import HaLayout, wait_for_sentinels, wait_until

pytestmark = pytest.mark.slow

REPOSITORY = Path(__file__).resolve().parents[2] / "triton_models"
TRITON_PORTS = (8000, 8001, 8002)
POOL = "ha"
NODES = {"b": "ha-b", "c": "ha-c"}
TIMING = {"node_heartbeat_s": "0.5", "node_ttl_s": "20", "stranded_after_s": "40",
          "recovery_audit_s": "1", "trajectory_memory_mb": "256", "redis_timeout_s": "2"}
"""A node outlives the failover (its TTL is longer), so nothing is answered ``node_lost``."""
TRAJECTORIES = 6
COMMANDS = 8
ROWS: list[dict[str, object]] = []


@dataclass
class Cluster:
    hosts: dict[str, Host]
    layout: HaLayout
    settings: Settings
    env: dict[str, str]
    logs: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def spawn(self, host: str, argv: list[str], log: str) -> subprocess.Popen[bytes]:
        process = self.hosts[host].spawn(argv, self.env, self.logs / log)
        self.procs[log] = process
        return process

    def tangram(self, host: str, args: list[str], log: str) -> subprocess.Popen[bytes]:
        return self.spawn(host, [sys.executable, "-m", "tangram_celery.cli", *args], log)


@contextlib.contextmanager
def nine_hosts(tmp_path: Path) -> Iterator[Cluster]:
    private = Path("/var/tmp") / f"tangram-ha-{uuid.uuid4().hex[:8]}"
    names = ["p", "r", "s1", "s2", "s3", "a", "b", "c", "d"]
    with network(names, private) as hosts:
        layout = HaLayout((hosts["p"].address, 6379), (hosts["r"].address, 6379),
                          tuple((hosts[s].address, 26379) for s in ("s1", "s2", "s3")))
        env = {**layout.env, "TANGRAM_SANDBOX_ROOT": str(private / "sandboxes"),
               **{f"TANGRAM_{k.upper()}": v for k, v in TIMING.items()}}
        cluster = Cluster(hosts, layout, Settings.from_env(env), env, tmp_path)
        try:
            cluster.spawn("p", layout.primary_argv(private / "redis"), "primary.log")
            cluster.spawn("r", layout.replica_argv(private / "redis"), "replica.log")
            for index, host in enumerate(("s1", "s2", "s3")):
                cluster.spawn(host, layout.sentinel_argv(index, private / "sentinel"),
                              f"sentinel-{index + 1}.log")
            with on_host(hosts["a"]):
                wait_for_sentinels(layout)
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
    for host, node in NODES.items():
        cluster.tangram(host, ["worker", "cpu", "--node", node, "--cores", "1",
                               "--memory-mb", "2048"], f"{node}.log")
    http, grpc, metrics = (str(p) for p in TRITON_PORTS)
    cluster.tangram("d", ["triton", "--repository", str(REPOSITORY), "--host", "127.0.0.1",
                          "--http-port", http, "--grpc-port", grpc, "--metrics-port", metrics,
                          "--log", str(cluster.logs / "triton.out")], "triton.log")
    cluster.env.update({"TANGRAM_TRITON_URL": f"127.0.0.1:{http}",
                        "TANGRAM_TRITON_REPOSITORY": str(REPOSITORY)})
    wait_until(lambda: "tritonserver ready" in (cluster.logs / "triton.log").read_text(), 120)
    pool = cluster.spawn("d", [sys.executable, "-m", "tangram_celery.pools.gpu_pool", "--pool",
                               POOL, "--gpus", "2"], "gpu-pool.log")
    name = worker_name(POOL, pool.pid)
    with on_host(cluster.hosts["a"]):
        wait_for_nodes(registry(cluster.settings), list(NODES.values()), timeout=90)
        wait_for_worker(make_app(cluster.settings), name, pool, timeout=120)
    return name


def registry(settings: Settings) -> Registry:
    return Registry(connect(settings.broker), settings.node.ttl_s,
                    settings.actions.trajectory_ttl_s)


def batch() -> list[Action]:
    """Per trajectory: commands that append their id to the work dir and print it, and a
    reward call every other command."""
    actions: list[Action] = []
    for t in range(TRAJECTORIES):
        tid = f"ha-{t}"
        for k in range(COMMANDS):
            aid = f"{tid}-c{k}"
            actions.append(command_action(tid, f"echo {aid} >> runs.log; sleep 0.3; echo {aid}",
                                          id=aid))
            if k % 2:
                actions.append(reward_action(tid, "answer_match", {
                    "response": "\\boxed{42}", "reference": "42"}, pool=POOL, id=f"{tid}-r{k}"))
    return actions


def results_on(client: redis.Redis) -> set[bytes]:
    return set(client.scan_iter(match=keys.action_result("*"), count=1000))


def inferences(cluster: Cluster) -> int:
    """Reward inferences Triton on D has run (its metrics, read from D's loopback)."""
    with on_host(cluster.hosts["d"]), urllib.request.urlopen(  # nosec B310 # a test's loopback
            f"http://127.0.0.1:{TRITON_PORTS[2]}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("nv_inference_request_success{")))


def runs(cluster: Cluster) -> Counter[str]:
    """How many times each CPU command ran: its lines in every work dir of every node."""
    counted: Counter[str] = Counter()
    root = cluster.settings.sandbox.root.relative_to("/")
    for node in NODES.values():
        seen = Path(f"/proc/{cluster.procs[f'{node}.log'].pid}/root") / root / node
        for t in range(TRAJECTORIES):
            for log in [*seen.glob(f"inst-*/{workdir_name(f'ha-{t}')}/runs.log"),
                        *seen.glob(f"inst-*/{workdir_name(f'ha-{t}')}/work/runs.log")]:
                counted.update(log.read_text().split())
    return counted


def lose_primary(cluster: Cluster, mode: str) -> None:
    cluster.hosts["p"].cut()
    if mode == "kill":
        cluster.procs["primary.log"].kill()


def first_result_after(cluster: Cluster, before: set[bytes], killed: float) -> float:
    """Seconds from the kill to the first result stored on the promoted primary that was not
    on the replica at the kill."""
    layout = cluster.layout
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        master = layout.master_seen_by(0)
        if master is not None and master != layout.primary:
            with contextlib.suppress(redis.RedisError):
                if results_on(layout.data(master)) - before:
                    return time.monotonic() - killed
        time.sleep(0.05)
    raise AssertionError("no result was stored on a promoted primary within 120 s")


def collect(handles: list[ActionHandle]) -> tuple[dict[str, ActionResult], list[str]]:
    answers: dict[str, ActionResult] = {}
    lost: list[str] = []
    deadline = time.monotonic() + 240
    for handle in handles:
        try:
            answers[handle.id] = handle.result(timeout=max(1.0, deadline - time.monotonic()))
        except ActionTimeout:
            lost.append(handle.id)
    return answers, lost


def durable_writes(cluster: Cluster, mine: dict[str, dict[str, int]]
                   ) -> dict[str, dict[str, int]]:
    """Durable writes of every process: the nodes' and the pool's (published with their
    heartbeats) and this client's since ``mine``."""
    client = connect(cluster.settings.broker)
    reports = [json.loads(client.hget(keys.node(n), "durable") or b"{}") for n in NODES.values()]
    reports.append(json.loads(client.hget(keys.gpu_pool(POOL), "durable") or b"{}"))
    reports.append(DURABILITY.snapshot())
    reports.append({k: {c: -n for c, n in counts.items()} for k, counts in mine.items()})
    total: dict[str, dict[str, int]] = {}
    for report in reports:
        for kind, counts in report.items():
            into = total.setdefault(kind, {"covered": 0, "uncovered": 0})
            for key in into:
                into[key] += int(counts.get(key, 0))
    return total


@pytest.fixture(scope="module", autouse=True)
def table() -> Iterator[None]:
    yield
    if not ROWS:
        return
    print("\n| run | primary | actions | answered once | lost | run twice | failover (s) | "
          "durable writes covered / not |")
    print("|---|---|---|---|---|---|---|---|")
    for row in ROWS:
        print("| {run} | {mode} | {actions} | {answered_once} | {lost} | {run_twice} | "
              "{failover_s:.2f} | {durable} |".format(**row))


@pytest.mark.parametrize("run", [1, 2])
@pytest.mark.parametrize("mode", ["kill", "partition"])
def test_a_failover_loses_nothing_and_runs_nothing_twice(tmp_path: Path, mode: str,
                                                         run: int) -> None:
    mine = DURABILITY.snapshot()
    with nine_hosts(tmp_path) as cluster:
        start_pools(cluster)
        layout = cluster.layout
        with on_host(cluster.hosts["a"]), TangramClient(cluster.settings) as client:
            replica = layout.data(layout.replica)
            inferred = inferences(cluster)
            actions = batch()
            handles = client.submit_many(actions)
            wait_until(lambda: len(results_on(replica)) >= len(actions) // 5, 180,
                       "a fifth of the batch answered")
            lose_primary(cluster, mode)
            killed = time.monotonic()
            before = results_on(replica)
            failover_s = first_result_after(cluster, before, killed)
            answers, lost = collect(handles)
            finished_s = time.monotonic() - killed
            ledger = {r.action_id: json.loads(client._redis.get(keys.action_result(
                r.action_id)) or b"{}") for r in answers.values()}
            counts = runs(cluster)
            rewards_run = inferences(cluster) - inferred
            if mode == "partition":
                cluster.hosts["p"].restore()
                wait_until(lambda: layout.data(layout.primary).info("replication")["role"]
                           == "slave", 60, "the old primary rejoins as a replica")
            durable = durable_writes(cluster, mine)
    commands = [a for a in actions if a.kind != "reward"]
    rewards = [a for a in actions if a.kind == "reward"]
    twice = sorted(a.id for a in commands if counts[a.id] > 1)
    if rewards_run > len(rewards):
        twice.append(f"{rewards_run - len(rewards)} reward inference(s) beyond one per action")
    once = [i for i, r in answers.items()
            if r.ok and ledger[i].get("status") == r.status and ledger[i].get("node") == r.node
            and (r.kind == "reward" or (r.output["stdout"] == f"{i}\n" and counts[i] == 1))]
    covered = sum(c["covered"] for c in durable.values())
    uncovered = sum(c["uncovered"] for c in durable.values())
    row = {"run": f"{mode}-{run}", "mode": "killed" if mode == "kill" else "partitioned",
           "actions": len(actions), "answered_once": len(once), "lost": len(lost),
           "run_twice": len(twice), "failover_s": failover_s,
           "durable": f"{covered} / {uncovered}", "finished_s": round(finished_s, 1),
           "by_kind": durable}
    ROWS.append(row)
    print(f"failover run: {json.dumps(row, default=str)}")
    assert lost == [], f"actions never answered: {lost}"
    assert twice == [], f"ran twice: {twice}"
    assert all(r.ok for r in answers.values()), [
        (r.action_id, r.status, r.error) for r in answers.values() if not r.ok]
    assert len(once) == len(actions), sorted(set(answers) - set(once))
    assert rewards_run == len(rewards)
    for result in answers.values():
        check_act(result, slack=result.timings.clock_error_s + 0.05)
    assert covered > 0 and {"result", "claim", "placement"} <= set(durable)
