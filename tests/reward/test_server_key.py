"""Triton's control plane behind ``TANGRAM_TRITON_KEY``, on a real ``tritonserver``.

A server started with a key refuses a model upload (a load with a files override: code that
would run in the server) and the other control APIs without the key, over HTTP and gRPC, and
accepts them with it; inference stays open. The GPU pool's executor sends the key. The key is
blanked in the server's command line once it answers, and ``tangram triton`` refuses to listen
off loopback without one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tangram_celery.errors import ConfigError, ServiceError
from tangram_celery.reward.executor import RewardExecutor
from tangram_celery.reward.repository import ModelSpec, load_repository
from tangram_celery.reward.server import TritonServer
from tangram_celery.reward.server.process import KEY_HEADER, RESTRICTED_APIS, restriction_args
from tangram_celery.reward.triton import Protocol, TritonClient

KEY = "k3y-for-the-control-plane_0123456789"
PAIR = {"response": "The answer is \\boxed{7}", "reference": "7"}


@pytest.fixture(scope="module")
def keyed_server(repository: Path, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[TritonServer]:
    """A server of its own, started with :data:`KEY`."""
    with TritonServer(repository, workdir=tmp_path_factory.mktemp("keyed"), key=KEY) as server:
        yield server


@pytest.fixture(scope="module")
def answer_match(repository: Path) -> ModelSpec:
    return load_repository(repository)["answer_match"]


def test_restriction_arguments_name_the_control_apis() -> None:
    assert restriction_args("") == []
    http, grpc = restriction_args("abc")
    assert http == f"--http-restricted-api={','.join(RESTRICTED_APIS)}:{KEY_HEADER}=abc"
    assert grpc.startswith("--grpc-restricted-protocol=model-repository,shared-memory,")
    assert {"model-repository", "shared-memory"} <= set(RESTRICTED_APIS)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_model_upload_without_the_key_is_refused_and_with_it_works(
        keyed_server: TritonServer, answer_match: ModelSpec, protocol: Protocol) -> None:
    url = keyed_server.http_url if protocol == "http" else keyed_server.grpc_url
    name = f"answer_match__upload_{protocol}"
    config = answer_match.override(name, [{"kind": "KIND_CPU", "count": 1}])
    outsiders = [TritonClient(url, protocol), TritonClient(url, protocol, key="not-the-key")]
    admin = TritonClient(url, protocol, key=KEY)
    try:
        for outsider in outsiders:
            with pytest.raises(ServiceError, match="TANGRAM_TRITON_KEY"):
                outsider.load(name, config=config, files=answer_match.files)
            with pytest.raises(ServiceError, match="TANGRAM_TRITON_KEY"):
                outsider.index()
            assert not outsider.model_ready(name)
        admin.load(name, config=config, files=answer_match.files)
        arrays, _ = answer_match.encode(PAIR)
        out = outsiders[0].infer(name, answer_match, arrays)  # inference stays open
        assert out["reward"].reshape(-1).tolist() == [1.0]
        with pytest.raises(ServiceError, match="TANGRAM_TRITON_KEY"):
            outsiders[0].unload(name)
        assert outsiders[0].model_ready(name)
        admin.unload(name)
    finally:
        for client in (*outsiders, admin):
            client.close()


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/v2/systemsharedmemory/status"),
    ("GET", "/v2/logging"),
    ("GET", "/v2/trace/setting"),
    ("POST", "/v2/repository/index"),
])
def test_the_other_control_apis_need_the_key_over_http(
        keyed_server: TritonServer, method: str, path: str) -> None:
    url = f"http://{keyed_server.http_url}{path}"
    data = b"{}" if method == "POST" else None
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(url, data=data, method=method), timeout=10)
    assert refused.value.code == 403
    keyed = urllib.request.Request(url, data=data, method=method, headers={KEY_HEADER: KEY})
    with urllib.request.urlopen(keyed, timeout=10) as reply:
        assert reply.status == 200
    with urllib.request.urlopen(f"http://{keyed_server.http_url}/v2/health/ready",
                                timeout=10) as reply:
        assert reply.status == 200


def test_the_gpu_pools_executor_sends_the_key(keyed_server: TritonServer,
                                               repository: Path) -> None:
    without = RewardExecutor(keyed_server.http_url, repository, gpu_ids=range(2))
    with pytest.raises(ServiceError, match="TANGRAM_TRITON_KEY"):
        without.run("answer_match", PAIR, (0,))
    without.close(unload=False)
    executor = RewardExecutor(keyed_server.http_url, repository, gpu_ids=range(2), key=KEY)
    try:
        outcome = executor.run("answer_match", PAIR, (1,))
        assert outcome.output == {"reward": 1.0} and outcome.loaded
    finally:
        assert executor.close() == [outcome.triton_model]


def test_the_key_is_blanked_in_the_servers_command_line(keyed_server: TritonServer) -> None:
    assert keyed_server.pid is not None and keyed_server.key_hidden
    cmdline = Path(f"/proc/{keyed_server.pid}/cmdline").read_bytes()
    assert KEY.encode() not in cmdline
    assert f"{KEY_HEADER}={'*' * len(KEY)}".encode() in cmdline


def test_no_key_means_loopback_only(repository: Path) -> None:
    with pytest.raises(ConfigError, match="TANGRAM_TRITON_KEY") as refused:
        TritonServer(repository, host="0.0.0.0").start()  # nosec B104 # the address refused
    assert "0.0.0.0" in str(refused.value)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANGRAM_")}
    done = subprocess.run(
        [sys.executable, "-m", "tangram_celery.cli", "triton", "--repository", str(repository),
         "--host", "0.0.0.0"], capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("tangram: error: refusing to start tritonserver on 0.0.0.0")
    assert "set TANGRAM_TRITON_KEY" in done.stderr
