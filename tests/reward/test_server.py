"""Launching the tritonserver binary of nvidia-pytriton."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from tangram_celery.errors import ServiceError
from tangram_celery.reward.server import (
    ServerPorts,
    TritonServer,
    assemble_backends,
    find_distribution,
    server_env,
)
from tangram_celery.reward.triton import TritonClient


def test_distribution_ships_binary_python_backend_and_stub() -> None:
    dist = find_distribution()
    assert dist.binary.name == "tritonserver" and os.access(dist.binary, os.X_OK)
    assert {p.name for p in dist.backend_files} == {
        "libtriton_python.so",
        "triton_python_backend_utils.py",
    }
    assert dist.stub.parent.name == "3.11"


def test_backend_dir_holds_the_python_backend_with_its_stub(tmp_path: Path) -> None:
    target = assemble_backends(find_distribution(), tmp_path / "backends")
    assert sorted(p.name for p in (target / "python").iterdir()) == [
        "libtriton_python.so",
        "triton_python_backend_stub",
        "triton_python_backend_utils.py",
    ]


def test_env_puts_our_libpython_and_venv_first(tmp_path: Path) -> None:
    dist = find_distribution()
    env = server_env(dist, tmp_path / "venv", tmp_path / "lib",
                     {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/opt/x"})
    assert env["LD_LIBRARY_PATH"].split(":") == [str(tmp_path / "lib"), str(dist.libs), "/opt/x"]
    assert env["PATH"].split(":") == [str(tmp_path / "venv" / "bin"), "/usr/bin"]
    assert env["HF_HUB_OFFLINE"] == "1"


def test_session_server_is_ready_on_its_own_ports(triton_server: TritonServer) -> None:
    assert triton_server.running()
    for client in (TritonClient(triton_server.http_url),
                   TritonClient(triton_server.grpc_url, "grpc")):
        assert client.ready()
        client.close()
    assert "--model-control-mode=explicit" in " ".join(triton_server.command(Path("b"), Path("c")))


def test_missing_repository_is_a_service_error(tmp_path: Path) -> None:
    with pytest.raises(ServiceError, match="not a directory"):
        TritonServer(tmp_path / "nope").start()


def test_server_starts_logs_and_stops_cleanly(repository: Path, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with TritonServer(repository, workdir=tmp_path / "work", log_path=log,
                      models=["answer_match"]) as server:
        pid, ports = server.pid, server.ports
        assert server.running() and pid is not None
        assert list(Path("/dev/shm").glob(f"{server.shm_prefix}*"))
    assert not server.running()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert "Started HTTPService" in log.read_text()
    assert _port_free(ports.http) and _port_free(ports.grpc)
    assert not list(Path("/dev/shm").glob(f"{server.shm_prefix}*"))


def test_a_server_that_cannot_start_says_why(repository: Path, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = ServerPorts(port, port, port)
        server = TritonServer(repository, ports=ports, workdir=tmp_path, startup_timeout_s=30)
        with pytest.raises(ServiceError, match="tritonserver exited during startup"):
            server.start()
    assert not server.running()


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is not "taken"
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
