"""The compose file as data, and ``tangram up`` / ``tangram down`` as real local processes.

Without Docker: the compose file parses, every service of tangram's image runs a real entry
point of the package (its argv parses with the ``tangram`` CLI's own parser), the interpolation
and localization rules hold, and ``tangram up`` really starts the stack (Redis, Triton, Flower,
a CPU node, a GPU pool), serves a mixed batch of CPU and reward actions through the client,
shows its status and stops everything on ``tangram down`` or Ctrl-C, leaving no process.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import yaml
from stack_batch import check_batch_results, flower_tasks, mixed_batch

from tangram_celery.cli import build_parser
from tangram_celery.client import TangramClient
from tangram_celery.errors import ConfigError
from tangram_celery.pools.launch import wait_for_nodes
from tangram_celery.pools.registry import Registry
from tangram_celery.processes import free_port, free_ports
from tangram_celery.settings import VARIABLES, Settings, variable
from tangram_celery.stack.compose import (
    DEFAULT_COMPOSE_FILE,
    Healthcheck,
    interpolate,
    load_compose,
    parse_duration,
    read_env_file,
    selected_services,
)
from tangram_celery.stack.local_service import LocalService, host_ports, localize, rewrite
from tangram_celery.stack.plan import client_settings, is_ours, replicate, stack_variables

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = ROOT / "compose"
REQUIRED = {"STACK_REDIS_PASSWORD": "pw", "TANGRAM_FLOWER_PASSWORD": "fpw",
            "TANGRAM_GATEWAY_TOKEN": "gwt", "TANGRAM_TRITON_KEY": "tk"}


def compose_variables() -> set[str]:
    """Every variable the compose file references."""
    text = DEFAULT_COMPOSE_FILE.read_text()
    return set(re.findall(r"\$\{([A-Za-z_]\w*)", text))


# ------------------------------------------------------------------ the compose file, no Docker


def test_compose_file_parses_as_yaml_with_the_stack_of_the_issue() -> None:
    document = yaml.safe_load(DEFAULT_COMPOSE_FILE.read_text())
    services = document["services"]
    assert {"redis", "triton", "flower", "cpu-node", "gateway", "gpu-pool", "autoscaler",
            "exporter", "prometheus"} <= set(services)
    assert "redis-data" in document["volumes"]
    compose = load_compose(DEFAULT_COMPOSE_FILE, REQUIRED)
    redis_service = compose.services["redis"]
    assert any(v.named and v.target == "/data" for v in redis_service.volumes)
    assert "/data" in redis_service.command
    assert redis_service.healthcheck is not None
    assert compose.services["triton"].healthcheck is not None
    for worker in ("cpu-node", "gpu-pool"):
        assert compose.services[worker].depends_on == {"redis": "service_healthy",
                                                       "triton": "service_healthy"}
    assert compose.services["prometheus"].profiles == ("monitoring",)
    assert compose.services["autoscaler"].profiles == ("autoscale",)
    assert "--no-auth" not in compose.services["flower"].command
    assert compose.services["flower"].environment["TANGRAM_FLOWER_PASSWORD"] == "fpw"
    assert compose.services["gateway"].environment["TANGRAM_GATEWAY_TOKEN"] == "gwt"
    for name in ("triton", "gpu-pool"):
        assert compose.services[name].environment["TANGRAM_TRITON_KEY"] == "tk"
    assert "TANGRAM_TRITON_KEY" not in compose.services["cpu-node"].environment


@pytest.mark.parametrize("missing", sorted(REQUIRED))
def test_compose_refuses_to_start_without_the_passwords(missing: str) -> None:
    with pytest.raises(ConfigError, match=f"set {missing} in compose/.env"):
        load_compose(DEFAULT_COMPOSE_FILE, {k: "x" for k in REQUIRED if k != missing})


def test_every_service_command_and_healthcheck_is_a_real_entry_point() -> None:
    compose = load_compose(DEFAULT_COMPOSE_FILE, REQUIRED)
    parser = build_parser()
    ours = [s for s in compose.services.values() if is_ours(s.image)]
    assert {s.name for s in compose.services.values()} - {s.name for s in ours} == \
        {"prometheus"}
    checked = 0
    for service in ours:
        argvs = [service.command]
        if service.healthcheck is not None:
            argvs.append(service.healthcheck.test)
        for argv in argvs:
            assert argv[0] == "tangram", f"{service.name}: {argv}"
            try:
                parser.parse_args(list(argv[1:]))
            except SystemExit as exc:  # argparse's way of refusing an argv
                pytest.fail(f"{service.name}: `{' '.join(argv)}` is not a valid tangram "
                            f"command ({exc})")
            checked += 1
    assert checked >= 9


def test_env_example_holds_known_settings_and_every_compose_variable() -> None:
    example = read_env_file(COMPOSE_DIR / ".env.example")
    settings_keys = {k: v for k, v in example.items() if k.startswith("TANGRAM_")}
    Settings.from_env({**settings_keys, "TANGRAM_FLOWER_PASSWORD": "x"})  # unknown keys raise
    assert all(k.startswith(("TANGRAM_", "STACK_")) for k in example)
    assert compose_variables() - set(example) <= {"STACK_ENV_FILE"}
    assert not example["STACK_REDIS_PASSWORD"] and not example["TANGRAM_FLOWER_PASSWORD"]
    assert not example["TANGRAM_GATEWAY_TOKEN"] and not example["TANGRAM_TRITON_KEY"]


def test_dockerfile_builds_from_a_base_image_argument_and_holds_no_secret() -> None:
    text = (COMPOSE_DIR / "Dockerfile").read_text()
    first_from = text.index("\nFROM ")
    assert "ARG BASE_IMAGE=tangram-base:bookworm-1" in text[:first_from]
    assert "FROM ${BASE_IMAGE}" in text
    assert not re.search(r"PASSWORD|requirepass|basic-auth", text.split("\nFROM ", 1)[1])
    assert "USER 10001" in text


@pytest.mark.parametrize(("text", "variables", "expected"), [
    ("${A}", {"A": "1"}, "1"),
    ("${A}", {}, ""),
    ("$A-x", {"A": "1"}, "1-x"),
    ("${A:-d}", {"A": ""}, "d"),
    ("${A-d}", {"A": ""}, ""),
    ("${A-d}", {}, "d"),
    ("${A:+set}", {"A": "1"}, "set"),
    ("${A:+set}", {"A": ""}, ""),
    ("$${A}", {"A": "1"}, "${A}"),
    ("redis://:${P:?need P}@redis:6379/0", {"P": "s"}, "redis://:s@redis:6379/0"),
])
def test_interpolation_follows_compose(text: str, variables: dict[str, str],
                                       expected: str) -> None:
    assert interpolate(text, variables) == expected


def test_interpolation_errors_name_the_variable() -> None:
    with pytest.raises(ConfigError, match="need P"):
        interpolate("${P:?need P}", {"P": ""})
    with pytest.raises(ConfigError, match="P is not set"):
        interpolate("${P?}", {})


def test_durations() -> None:
    assert parse_duration("2s", 0) == 2.0
    assert parse_duration("1m30s", 0) == 90.0
    assert parse_duration("500ms", 0) == 0.5
    assert parse_duration(None, 7.0) == 7.0
    with pytest.raises(ConfigError):
        parse_duration("2 seconds", 0)


def test_rewrite_maps_service_addresses_and_container_paths() -> None:
    addresses = {"redis:6379": "127.0.0.1:16379", "triton:8000": "127.0.0.1:18000"}
    paths = {"/opt/tangram": "/src", "/data": "/state/volumes/redis-data",
             "/var/run/docker.sock": "/tmp/d.sock"}
    assert rewrite("redis://:pw@redis:6379/0", addresses, paths) == \
        "redis://:pw@127.0.0.1:16379/0"
    assert rewrite("http://triton:8000", addresses, paths) == "http://127.0.0.1:18000"
    assert rewrite("myredis:6379", addresses, paths) == "myredis:6379"
    assert rewrite("redis:63790", addresses, paths) == "redis:63790"
    assert rewrite("/opt/tangram/triton_models", addresses, paths) == "/src/triton_models"
    assert rewrite("--dir=/data", addresses, paths) == "--dir=/state/volumes/redis-data"
    assert rewrite("/database", addresses, paths) == "/database"
    assert rewrite("/x/data", addresses, paths) == "/x/data"
    assert rewrite("unix:///var/run/docker.sock", addresses, paths) == "unix:///tmp/d.sock"


def test_selection_follows_dependencies_and_profiles() -> None:
    compose = load_compose(DEFAULT_COMPOSE_FILE, REQUIRED)
    default = selected_services(compose)
    assert default[:2] in (["redis", "triton"], ["triton", "redis"])
    assert set(default) == {"redis", "triton", "flower", "cpu-node", "gateway", "gpu-pool"}
    assert selected_services(compose, ["flower"]) == ["redis", "flower"]
    monitoring = selected_services(compose, profiles=["monitoring"])
    assert {"exporter", "prometheus"} <= set(monitoring)
    assert monitoring.index("exporter") < monitoring.index("prometheus")
    with pytest.raises(ConfigError, match="no service"):
        selected_services(compose, ["nope"])


def test_localize_gives_the_same_commands_on_loopback_and_published_ports(
        tmp_path: Path) -> None:
    variables = {**REQUIRED, "STACK_REDIS_PORT": "23456", "STACK_FLOWER_PORT": "23457"}
    compose = load_compose(DEFAULT_COMPOSE_FILE, variables)
    names = selected_services(compose)
    local = localize(compose, names, host_ports(compose, names), tmp_path / "volumes",
                     python="/py")
    redis_local = local["redis"]
    assert redis_local.argv == ("/py", "-m", "tangram_celery.cli", "redis", "--bind",
                                "127.0.0.1", "--port", "23456", "--dir",
                                str(tmp_path / "volumes" / "redis-data"))
    assert redis_local.environment["TANGRAM_REDIS_URL"] == "redis://:pw@127.0.0.1:23456/0"
    assert local["flower"].argv[-4:] == ("--address", "127.0.0.1", "--port", "23457")
    triton = local["triton"]
    assert triton.argv[triton.argv.index("--repository") + 1] == str(ROOT / "triton_models")
    assert triton.environment["TANGRAM_TRITON_URL"] == "http://127.0.0.1:18000"
    assert isinstance(triton.healthcheck, Healthcheck)
    assert triton.healthcheck.test == ("/py", "-m", "tangram_celery.cli", "triton", "--check")
    container = compose.services["cpu-node"].command
    assert local["cpu-node"].argv[3:] == container[1:]  # no address in it: identical
    assert local["gateway"].argv[-4:] == ("--address", "127.0.0.1", "--port", "18080")
    assert local["gateway"].healthcheck is not None
    assert local["gateway"].healthcheck.test[-3:] == ("--check", "--port", "18080")
    client = client_settings(local)
    assert client["SANDBOX_FUSION_URL"] == \
        f"http://127.0.0.1:18080/run_code?token={REQUIRED['TANGRAM_GATEWAY_TOKEN']}"
    assert Settings.from_env(client).gateway.token == REQUIRED["TANGRAM_GATEWAY_TOKEN"]


def test_stack_variables_generate_and_keep_missing_passwords(tmp_path: Path) -> None:
    path = tmp_path / "secrets.env"
    first = stack_variables({}, {}, path, "bwrap")
    assert first["STACK_SANDBOX_BACKEND"] == "bwrap"
    assert len(first["STACK_REDIS_PASSWORD"]) >= 20
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    again = stack_variables({}, {}, path, "docker")
    assert again["STACK_REDIS_PASSWORD"] == first["STACK_REDIS_PASSWORD"]
    given = stack_variables({"STACK_REDIS_PASSWORD": "mine"}, {"TANGRAM_FLOWER_PASSWORD": "f"},
                            path, "bwrap")
    assert given["STACK_REDIS_PASSWORD"] == "mine" and given["TANGRAM_FLOWER_PASSWORD"] == "f"


def _local(name: str, depends_on: dict[str, str] | None = None,
           ports: dict[int, int] | None = None) -> LocalService:
    return LocalService(name=name, argv=("run", name), environment={}, healthcheck=None,
                        depends_on=depends_on or {}, ports=ports or {}, restart="no",
                        stop_grace_s=1.0)


def test_replicate_names_copies_in_place_and_expands_dependencies() -> None:
    services = {"a": _local("a"), "b": _local("b", {"a": "service_healthy"}),
                "c": _local("c", {"b": "service_started"})}
    result = replicate(services, "b", [_local("x", {"a": "service_healthy"}),
                                       _local("y", {"a": "service_healthy"})])
    assert list(result) == ["a", "b-1", "b-2", "c"]
    assert result["b-1"].name == "b-1" and result["b-2"].argv == ("run", "y")
    assert result["b-2"].depends_on == {"a": "service_healthy"}
    assert result["c"].depends_on == {"b-1": "service_started", "b-2": "service_started"}


def test_replicate_refuses_a_service_with_ports_or_not_started() -> None:
    with pytest.raises(ConfigError, match="listens on ports"):
        replicate({"a": _local("a", ports={80: 8080})}, "a", [_local("a")])
    with pytest.raises(ConfigError, match="not among the services"):
        replicate({"a": _local("a")}, "z", [_local("z")])



# ------------------------------------------------------------------ tangram up, real processes


def leftovers(marker: str, sandbox_root: Path) -> list[str]:
    """Processes started by the stack: the marker in their environment, or the sandbox root
    in their command line (sandboxes start from a clean environment)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state in ("Z", "X"):
            continue
        if marker.encode() in environ or str(sandbox_root).encode() in cmdline:
            shown = cmdline.replace(b"\0", b" ")[:160]
            found.append(f"{entry.name}: {shown!r}")
    return found


def secrets_shown(marker: str, secrets_: dict[str, str], logs: Path) -> list[str]:
    """Where a secret of the stack shows: the command line (what ``ps`` shows) of a process with
    the marker in its environment, or a line of a service's log."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() not in (entry / "environ").read_bytes():
                continue
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        found += [f"{name} in the command line of {entry.name}: {cmdline[:120]!r}"
                  for name, value in secrets_.items() if value.encode() in cmdline]
    for log in sorted(logs.glob("*.log")):
        text = log.read_text(errors="replace")
        found += [f"{name} in {log.name}" for name, value in secrets_.items() if value in text]
    return found


def wait_leftovers_gone(marker: str, sandbox_root: Path, timeout: float = 15.0) -> list[str]:
    """:func:`leftovers`, once none is left or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        left = leftovers(marker, sandbox_root)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


class UpProcess:
    """A ``tangram up`` subprocess on its own ports and state directory."""

    def __init__(self, tmp_path: Path, services: tuple[str, ...] = ()) -> None:
        self.state_dir = tmp_path / "state"
        self.marker = f"tgup{uuid.uuid4().hex[:10]}"
        self.sandbox_root = Path("/var/tmp") / f"tangram-test-{self.marker}"
        names = ("STACK_REDIS_PORT", "STACK_TRITON_HTTP_PORT", "STACK_TRITON_GRPC_PORT",
                 "STACK_TRITON_METRICS_PORT", "STACK_FLOWER_PORT", "STACK_GATEWAY_PORT")
        self.ports = dict(zip(names, free_ports(len(names)), strict=True))
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("TANGRAM_", "STACK_"))}
        env.update({k: str(v) for k, v in self.ports.items()})
        env.update({"STACK_TEST_MARKER": self.marker, "STACK_CPU_NODE": f"n-{self.marker}",
                    "TANGRAM_SANDBOX_ROOT": str(self.sandbox_root),
                    "TANGRAM_NODE_HEARTBEAT_S": "0.5", "TANGRAM_NODE_TTL_S": "3",
                    "TANGRAM_FLOWER_PASSWORD": secrets.token_urlsafe(12)})
        self.env = env
        self.output = tmp_path / "up.out"
        self.started = time.monotonic()
        with open(self.output, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tangram_celery.cli", "up", "--state-dir",
                 str(self.state_dir), "--env-file", str(tmp_path / "none.env"), *services],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                cwd=tmp_path)

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def wait_ready(self, timeout: float = 180.0) -> dict[str, object]:
        deadline = time.monotonic() + timeout
        path = self.state_dir / "stack.json"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"tangram up exited with {self.process.returncode}:\n{self.text()}")
            try:
                state = json.loads(path.read_text())
            except (OSError, ValueError):
                state = {}
            if state.get("ready"):
                return dict(state)
            time.sleep(0.2)
        pytest.fail(f"tangram up not ready within {timeout} s:\n{self.text()}")

    def client_settings(self) -> Settings:
        return Settings.from_env(read_env_file(self.state_dir / "client.env"))

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(120)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        shutil.rmtree(self.sandbox_root, ignore_errors=True)


@pytest.fixture()
def up_stack(tmp_path: Path) -> Iterator[UpProcess]:
    stack = UpProcess(tmp_path)
    yield stack
    stack.kill()
    for log in sorted((stack.state_dir / "logs").glob("*.log")):
        text = log.read_text(errors="replace")
        if "Traceback" in text:
            print(f"--- {log.name} ---\n{text[-3000:]}")


@pytest.mark.slow
def test_tangram_up_serves_a_mixed_batch_and_down_stops_everything(
        up_stack: UpProcess) -> None:
    state = up_stack.wait_ready()
    up_seconds = time.monotonic() - up_stack.started
    services = state["services"]
    assert isinstance(services, dict)
    assert set(services) == {"redis", "triton", "flower", "cpu-node", "gateway", "gpu-pool"}
    settings = up_stack.client_settings()
    assert settings.broker.redis_url.endswith(f"127.0.0.1:{up_stack.ports['STACK_REDIS_PORT']}/0")
    client_redis = redis.Redis.from_url(settings.broker.redis_url)
    wait_for_nodes(Registry(client_redis, 3.0, 600), [f"n-{up_stack.marker}"], timeout=60)
    client_redis.close()
    started = time.monotonic()
    with TangramClient(settings) as client:
        results = client.run_batch(mixed_batch(up_stack.marker), timeout=240)
    batch_seconds = time.monotonic() - started
    check_batch_results(results)
    tasks = flower_tasks(up_stack.ports["STACK_FLOWER_PORT"],
                         up_stack.env["TANGRAM_FLOWER_PASSWORD"])
    assert {r.action_id for r in results} <= set(tasks)
    token = read_env_file(up_stack.state_dir / "client.env")["TANGRAM_GATEWAY_TOKEN"]
    assert token == settings.gateway.token and len(token) >= 20
    gateway = f"http://127.0.0.1:{up_stack.ports['STACK_GATEWAY_PORT']}/run_code"
    request = urllib.request.Request(f"{gateway}?token={token}",
                                     data=b'{"code": "print(6 * 7)", "language": "python"}')
    with urllib.request.urlopen(request, timeout=120) as reply:
        answer = json.loads(reply.read())
    assert answer["status"] == "Success" and answer["run_result"]["stdout"] == "42\n", answer
    stack_secrets = {**read_env_file(up_stack.state_dir / "secrets.env"),
                     "TANGRAM_FLOWER_PASSWORD": up_stack.env["TANGRAM_FLOWER_PASSWORD"]}
    assert set(stack_secrets) == {"STACK_REDIS_PASSWORD", "TANGRAM_FLOWER_PASSWORD",
                                  "TANGRAM_GATEWAY_TOKEN", "TANGRAM_TRITON_KEY"}
    assert secrets_shown(up_stack.marker, stack_secrets, up_stack.state_dir / "logs") == []
    assert not [name for name, value in stack_secrets.items() if value in up_stack.text()]

    text = up_stack.text()
    for name in ("redis", "triton", "gateway"):
        assert re.search(rf"│ {name}\s+│ healthy", text), text
    for name in ("flower", "cpu-node", "gpu-pool"):
        assert re.search(rf"│ {name}\s+│ running", text), text
    assert "stack up in" in text

    down = subprocess.run([sys.executable, "-m", "tangram_celery.cli", "down", "--state-dir",
                           str(up_stack.state_dir)], capture_output=True, text=True,
                          timeout=240, env=up_stack.env, check=False)
    assert down.returncode == 0, down.stdout + down.stderr
    assert up_stack.process.wait(30) == 0
    assert not (up_stack.state_dir / "stack.json").exists()
    assert wait_leftovers_gone(up_stack.marker, up_stack.sandbox_root) == []
    assert (up_stack.state_dir / "volumes" / "redis-data" / "appendonlydir").is_dir()
    print(f"tangram up ready in {up_seconds:.1f} s; mixed batch of 8 in {batch_seconds:.1f} s")


@pytest.mark.slow
def test_tangram_up_stops_on_ctrl_c_and_restarts_a_crashed_service(tmp_path: Path) -> None:
    stack = UpProcess(tmp_path, services=("flower",))
    try:
        state = stack.wait_ready(timeout=60)
        services = state["services"]
        assert isinstance(services, dict) and set(services) == {"redis", "flower"}
        flower_pid = int(services["flower"]["pid"])
        os.kill(flower_pid, signal.SIGKILL)  # restart: unless-stopped brings it back
        deadline = time.monotonic() + 30
        new_pid = flower_pid
        while time.monotonic() < deadline and new_pid == flower_pid:
            time.sleep(0.3)
            with_pid = json.loads((stack.state_dir / "stack.json").read_text())
            new_pid = int(with_pid["services"]["flower"]["pid"])
        assert new_pid != flower_pid, stack.text()
        assert "flower: exited with -9" in stack.text()
        stack.process.send_signal(signal.SIGINT)
        assert stack.process.wait(60) == 0
        assert wait_leftovers_gone(stack.marker, stack.sandbox_root) == []
        assert re.search(r"│ flower\s+│ stopped, 1 restarts", stack.text()), stack.text()
    finally:
        stack.kill()


def test_tangram_down_without_a_stack_says_so(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "tangram_celery.cli", "down", "--state-dir",
                           str(tmp_path)], capture_output=True, text=True, timeout=60,
                          check=False, env={k: v for k, v in os.environ.items()
                                            if not k.startswith("TANGRAM_")})
    assert done.returncode == 0
    assert "no stack runs" in done.stdout


def test_tangram_up_refuses_a_busy_port(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TANGRAM_", "STACK_"))}
        done = subprocess.run(
            [sys.executable, "-m", "tangram_celery.cli", "up", "redis", "--state-dir",
             str(tmp_path / "s"), "--env-file", str(tmp_path / "none.env")],
            capture_output=True, text=True, timeout=60, check=False,
            env={**env, "STACK_REDIS_PORT": str(port)})
    assert done.returncode == 2
    assert f"redis:6379 -> 127.0.0.1:{port}" in done.stderr


def test_settings_fields_the_compose_file_sets_exist() -> None:
    known = {variable(key) for key in VARIABLES}
    compose = load_compose(DEFAULT_COMPOSE_FILE, REQUIRED)
    for service in compose.services.values():
        for key in service.environment:
            assert key in known, f"{service.name}: {key} is not a setting"


def test_a_service_that_fails_at_start_stops_the_stack(tmp_path: Path) -> None:
    compose_file = tmp_path / "compose.yml"
    compose_file.write_text(yaml.safe_dump({
        "services": {
            "redis": {"image": "tangram:test", "command": ["tangram", "redis", "--dir", "/d"],
                      "environment": {"TANGRAM_REDIS_URL": "redis://redis:6379/0"},
                      "expose": ["6379"], "ports": ["127.0.0.1:${R_PORT}:6379"],
                      "volumes": ["data:/d"],
                      "healthcheck": {"test": ["CMD", "tangram", "redis", "--check"],
                                      "interval": "1s", "retries": 10}},
            "broken": {"image": "tangram:test",
                       "command": ["tangram", "triton", "--repository", "/nonexistent"],
                       "healthcheck": {"test": ["CMD", "tangram", "triton", "--check"],
                                       "interval": "1s", "retries": 30},
                       "depends_on": {"redis": {"condition": "service_healthy"}}},
        },
        "volumes": {"data": None},
    }))
    marker = f"tgfail{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TANGRAM_", "STACK_"))}
    done = subprocess.run(
        [sys.executable, "-m", "tangram_celery.cli", "up", "-f", str(compose_file),
         "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True, timeout=120, check=False,
        env={**env, "R_PORT": str(free_port()), "STACK_TEST_MARKER": marker})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "broken exited with" in done.stderr
    assert "redis: healthy" in done.stdout and "redis: stopping" in done.stdout
    assert wait_leftovers_gone(marker, tmp_path / "no-sandboxes") == []
    assert not (tmp_path / "state" / "stack.json").exists()
