"""Security settings on real parts: Redis with a password (AUTH) and over TLS, a wrong password
refused in one clear line, and the password never reaching task arguments, Flower, logs,
sandboxes, stored results or dead letters."""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from flower_checks import finished_in_flower, flower_json, watching_events

from tangram_celery import keys
from tangram_celery.client import TangramClient, command_action
from tangram_celery.errors import BrokerAuthFailed
from tangram_celery.observe.flower import flower_process
from tangram_celery.pools.launch import spawn_cpu_worker, wait_for_nodes
from tangram_celery.pools.registry import Registry
from tangram_celery.processes import free_port, stop_process
from tangram_celery.settings import Settings
from tangram_celery.stack.broker import embedded_redis, redis_server_binary
from tangram_celery.tasks.ledger import Ledger

pytestmark = pytest.mark.slow

LEAK_CMD = ("env; for f in /proc/self/environ /proc/1/environ; do "
            "tr '\\0' '\\n' < $f 2>/dev/null; done; echo done")


@contextlib.contextmanager
def cpu_cluster(url: str, nodes: dict[str, int], logs: Path) -> Iterator[Settings]:
    """CPU node worker subprocesses on the Redis at ``url``; yields the settings for it."""
    root = Path("/var/tmp") / f"tangram-sec-{uuid.uuid4().hex[:8]}"
    env = {"TANGRAM_REDIS_URL": url, "TANGRAM_SANDBOX_ROOT": str(root),
           "TANGRAM_NODE_HEARTBEAT_S": "0.5", "TANGRAM_NODE_TTL_S": "3.0"}
    settings = Settings.from_env({}, redis_url=url, sandbox_root=root, node_heartbeat_s=0.5,
                                 node_ttl_s=3.0)
    procs = [spawn_cpu_worker(env, n, c, logs / f"{n}.log") for n, c in nodes.items()]
    try:
        wait_for_nodes(Registry(redis.Redis.from_url(url), 3.0, 3600), list(nodes))
        yield settings
    finally:
        for proc in procs:
            stop_process(proc)


def test_a_password_protected_redis_carries_work_and_a_wrong_password_is_one_line(
    tmp_path: Path,
) -> None:
    password = secrets.token_urlsafe(16)
    with embedded_redis(password=password) as server, \
            cpu_cluster(server.url, {"auth-a": 1}, tmp_path) as settings:
        assert server.url.startswith(f"redis://:{password}@")
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=server.port).ping()
        with TangramClient(settings) as client:
            result = client.submit(command_action("auth-t", "echo authed")).result(60)
        assert result.ok and result.output["stdout"] == "authed\n"
        wrong = server.url.replace(password, "not-the-password")
        check_wrong_password(Settings.from_env({}, redis_url=wrong), wrong)


def check_wrong_password(settings: Settings, url: str) -> None:
    """The client refuses a wrong password with one line naming the setting, no secret."""
    with TangramClient(settings) as client, pytest.raises(BrokerAuthFailed) as refused:
        client.submit(command_action("auth-t", "echo never"))
    message = str(refused.value)
    assert "\n" not in message and "refused the password" in message
    assert "TANGRAM_REDIS_URL" in message and "not-the-password" not in message
    cli = subprocess.run([sys.executable, "-m", "tangram_celery.cli", "status"],
                         env={"TANGRAM_REDIS_URL": url, "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=60, check=False)
    assert cli.returncode != 0 and "Traceback" not in cli.stderr, cli.stderr
    assert len(cli.stderr.strip().splitlines()) == 1, cli.stderr
    assert "not-the-password" not in cli.stderr + cli.stdout


# --------------------------------------------------------------------------- TLS


def make_certs(directory: Path) -> dict[str, Path]:
    """A self-signed CA and a server certificate for 127.0.0.1 signed by it (openssl)."""
    paths = {k: directory / f"{k}.pem" for k in ("ca", "ca-key", "cert", "key")}
    ext = directory / "san.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run = ["openssl"]
    commands = [
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=tangram-ca",
         "-keyout", str(paths["ca-key"]), "-out", str(paths["ca"])],
        ["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
         "-keyout", str(paths["key"]), "-out", str(directory / "server.csr")],
        ["x509", "-req", "-in", str(directory / "server.csr"), "-CA", str(paths["ca"]),
         "-CAkey", str(paths["ca-key"]), "-CAcreateserial", "-days", "1",
         "-extfile", str(ext), "-out", str(paths["cert"])],
    ]
    for command in commands:
        subprocess.run(run + command, check=True, capture_output=True, timeout=60)
    return paths


@contextlib.contextmanager
def tls_redis(directory: Path, password: str) -> Iterator[str]:
    """redis-server answering only TLS (plus AUTH); yields its ``rediss://`` URL."""
    certs = make_certs(directory)
    port = free_port()
    process = subprocess.Popen(
        [redis_server_binary(), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(certs["cert"]), "--tls-key-file", str(certs["key"]),
         "--tls-ca-cert-file", str(certs["ca"]), "--tls-auth-clients", "no",
         "--requirepass", password, "--save", "", "--dir", str(directory)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = (f"rediss://:{password}@127.0.0.1:{port}/0?ssl_cert_reqs=required"
           f"&ssl_ca_certs={certs['ca']}")
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(redis.ConnectionError):
                if redis.Redis.from_url(url).ping():
                    break
            assert process.poll() is None and time.monotonic() < deadline, "no TLS redis"
            time.sleep(0.05)
        yield url
    finally:
        stop_process(process)


def test_workers_and_client_over_tls(tmp_path: Path) -> None:
    password = secrets.token_urlsafe(16)
    with tls_redis(tmp_path, password) as url:
        with pytest.raises(redis.ConnectionError):  # plain TCP is not answered
            redis.Redis.from_url(url.split("?")[0].replace("rediss://", "redis://"),
                                 socket_timeout=2).ping()
        with cpu_cluster(url, {"tls-a": 1}, tmp_path) as settings, \
                TangramClient(settings) as client:
            result = client.submit(command_action("tls-t", "echo over-tls")).result(60)
    assert result.ok and result.output["stdout"] == "over-tls\n"


# --------------------------------------------------------------------------- no secret leaks


def test_the_redis_password_reaches_no_argument_log_sandbox_result_or_dead_letter(
    tmp_path: Path,
) -> None:
    password = secrets.token_urlsafe(16)
    with embedded_redis(password=password) as server, \
            cpu_cluster(server.url, {"sec-a": 2}, tmp_path) as settings, \
            flower_process(settings, log_path=tmp_path / "flower.log") as flower, \
            TangramClient(settings) as client:
        watching_events(flower, client, "sec-probe")
        actions = [command_action(f"sec-{k % 3}", LEAK_CMD if k % 2 else f"echo {k}")
                   for k in range(12)]
        results = client.run_batch(actions, timeout=120)
        client.app.send_task(keys.task_name("exec"), args=[{"x": 1}], serializer="pickle",
                             queue=keys.cpu_queue("sec-a"))
        raw = redis.Redis.from_url(server.url)
        text = redis.Redis.from_url(server.url, decode_responses=True)
        deadline = time.monotonic() + 30
        while not Ledger(raw, 60).dead_letters():
            assert time.monotonic() < deadline, "the pickled message was not dead-lettered"
            time.sleep(0.1)
        seen = {
            "flower tasks": json.dumps(finished_in_flower(flower, [a.id for a in actions])),
            "flower workers": json.dumps(flower_json(flower, "/api/workers")),
            "results": json.dumps([r.to_json() for r in results]),
            "stored results": " ".join(
                str(text.get(keys.action_result(a.id)) or "") for a in actions),
            "dead letters": json.dumps(Ledger(raw, 60).dead_letters()) + "".join(
                base64.b64decode(d["body_b64"]).decode(errors="replace")
                for d in Ledger(raw, 60).dead_letters()),
        }
        for k in range(12):
            client.end_trajectory(f"sec-{k % 3}")
    seen.update({f"log {p.name}": p.read_text(errors="replace") for p in tmp_path.glob("*.log")})
    sandbox = [r.output["stdout"] for r, a in zip(results, actions, strict=True)
               if a.payload["cmd"] == LEAK_CMD]
    assert all(r.ok for r in results) and all(s.endswith("done\n") for s in sandbox)
    assert all("PATH=" in s for s in sandbox), "the env dump ran: the check is not vacuous"
    seen["sandbox env"] = "".join(sandbox)
    leaks = [where for where, text in seen.items() if password in text]
    assert not leaks, f"the Redis password leaked into {leaks}"
    assert not [w for w, text in seen.items() if "TANGRAM_REDIS_URL" in text and "sandbox" in w]
