"""A CPU node cut off from Redis fences itself, on real parts: two network namespaces (see
``tests/hosts.py``), Redis and the training script on host A, one CPU node (1 core) on host B.

Trajectory T1 runs a long action L on B's only core; trajectory T2's actions Q1-Q3 wait on B
behind it (held in B's admission window). Then B's link is cut. The clients answer every action
queued for B ``node_lost`` once B has been silent for ``TANGRAM_STRANDED_AFTER_S``; B must treat
itself the same way once its heartbeat has not reached Redis for ``TANGRAM_NODE_TTL_S``:

* no action starts on B from the TTL on (each action writes when it started into its
  trajectory's work dir, read through B's own mount namespace): before fencing, B would start
  Q1 as soon as L ended, on a link that is down, and its result would be thrown away;
* with ``TANGRAM_FENCE_RUNNING=finish`` L runs to its end; with ``kill`` it is killed when the
  fence closes (B's allocation record of L ends there);
* once the link is back, B registers again, does not run Q1-Q3 (they were answered), and takes
  new trajectories.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from hosts import Host, network, on_host

from tangram_celery.client import TangramClient, code_action, command_action
from tangram_celery.pools.launch import wait_for_nodes
from tangram_celery.pools.registry import Registry
from tangram_celery.processes import stop_process
from tangram_celery.sandbox.workdir import workdir_name
from tangram_celery.settings import Settings
from tangram_celery.stack.broker import redis_answers

pytestmark = pytest.mark.slow

REDIS_PORT = 6391
NODE = "fence-b"
TTL_S = 3.0
LONG_S = 8.0
CUT_S = 13.0
TIMING = {"node_heartbeat_s": "0.5", "node_ttl_s": str(TTL_S), "stranded_after_s": "4",
          "recovery_audit_s": "1", "trajectory_memory_mb": "256"}


def wait_until(condition: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, redis.RedisError):
            if condition():  # type: ignore[operator]
                return
        time.sleep(0.1)
    raise AssertionError(f"condition not met in {timeout} s")


@contextlib.contextmanager
def two_hosts(tmp_path: Path, mode: str) -> Iterator[tuple[dict[str, Host], Settings,
                                                          subprocess.Popen[bytes]]]:
    private = Path("/var/tmp") / f"tangram-fence-{uuid.uuid4().hex[:8]}"
    procs: list[subprocess.Popen[bytes]] = []
    with network(["a", "b"], private) as hosts:
        url = f"redis://:fence-{uuid.uuid4().hex}@{hosts['a'].address}:{REDIS_PORT}/0"
        env = {"TANGRAM_REDIS_URL": url, "TANGRAM_SANDBOX_ROOT": str(private / "sandboxes"),
               "TANGRAM_FENCE_RUNNING": mode,
               **{f"TANGRAM_{k.upper()}": v for k, v in TIMING.items()}}
        settings = Settings.from_env(env)
        try:
            procs.append(hosts["a"].spawn([sys.executable, "-m", "tangram_celery.cli", "redis",
                                           "--bind", hosts["a"].address, "--dir",
                                           str(private / "redis")], env,
                                          tmp_path / "redis.log"))
            with on_host(hosts["a"]):
                wait_until(lambda: redis_answers(url), 20)
            node = hosts["b"].spawn([sys.executable, "-m", "tangram_celery.cli", "worker", "cpu",
                                     "--node", NODE, "--cores", "1", "--memory-mb", "2048"],
                                    env, tmp_path / "node.log")
            procs.append(node)
            yield hosts, settings, node
        finally:
            for process in reversed(procs):
                stop_process(process, timeout=30)
            for log in sorted(tmp_path.glob("*.log")):
                text = log.read_text(errors="replace")
                if "Traceback" in text:
                    print(f"--- {log.name} ---\n{text[-3000:]}")


def starts(node: subprocess.Popen[bytes], settings: Settings, trajectory: str) -> dict[str, float]:
    """When each action of ``trajectory`` started (its own line in the work dir's runs.log),
    read through the node's mount namespace."""
    root = Path(f"/proc/{node.pid}/root") / settings.sandbox.root.relative_to("/") / NODE
    found: dict[str, float] = {}
    for log in [*root.glob(f"inst-*/{workdir_name(trajectory)}/runs.log"),
                *root.glob(f"inst-*/{workdir_name(trajectory)}/work/runs.log")]:
        for line in log.read_text().splitlines():
            name, at = line.split()
            found[name] = float(at)
    return found


def stamped(trajectory: str, name: str, command: str) -> object:
    return command_action(trajectory, f"echo {name} $(date +%s.%N) >> runs.log; {command}",
                          id=f"{trajectory}-{name}")


@pytest.mark.parametrize("mode", ["finish", "kill"])
def test_a_node_cut_off_starts_nothing_until_it_registers_again(tmp_path: Path,
                                                                mode: str) -> None:
    with two_hosts(tmp_path, mode) as (hosts, settings, node), on_host(hosts["a"]), \
            TangramClient(settings) as client:
        registry = Registry(redis.Redis.from_url(settings.broker.redis_url), TTL_S, 3600)
        wait_for_nodes(registry, [NODE], timeout=60)
        t1, t2 = f"f1-{mode}", f"f2-{mode}"
        long = client.submit(stamped(t1, "L", f"sleep {LONG_S}; echo done $(date +%s.%N) "
                                              ">> runs.log"))
        wait_until(lambda: "L" in starts(node, settings, t1), 60)
        waiting = client.submit_many([stamped(t2, f"Q{k}", "sleep 0.2") for k in range(3)])
        time.sleep(1.5)
        hosts["b"].cut()
        cut_at = time.time()
        answers = [h.result(timeout=60) for h in [long, *waiting]]
        time.sleep(max(0.0, cut_at + CUT_S - time.time()))
        hosts["b"].restore()
        restored_at = time.time()
        wait_until(lambda: NODE in {v.name for v in registry.nodes() if v.alive}, 60)
        after = client.run_batch([code_action(f"f3-{mode}-{i}", "print('back')")
                                  for i in range(2)], timeout=120)
        time.sleep(2.0)
        late = starts(node, settings, t2)
        first = starts(node, settings, t1)
    assert [a.status for a in answers] == ["node_lost"] * 4, [(a.status, a.error) for a in answers]
    assert all(r.ok and r.node == NODE for r in after), [(r.status, r.error) for r in after]
    fenced_from = cut_at + TTL_S + 1.0
    started_while_fenced = {n: t for n, t in late.items() if fenced_from < t < restored_at}
    assert started_while_fenced == {}, f"actions started on a fenced node: {started_while_fenced}"
    assert late == {}, f"answered actions ran after the node came back: {late}"
    if mode == "finish":
        assert first["done"] - first["L"] >= LONG_S - 0.5 and first["done"] > fenced_from, first
        outcome = f"L ran to its end, {first['done'] - cut_at:.1f} s after the cut"
    else:
        log = (tmp_path / "node.log").read_text(errors="replace")
        assert f"killing action {t1}-L" in log, log[-3000:]
        assert "done" not in first, first
        outcome = "L was killed when the fence closed"
    print(f"fencing ({mode}): {outcome}; Q0-Q2 never started")
