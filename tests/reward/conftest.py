"""Fixtures of the reward tests: one real ``tritonserver`` (from nvidia-pytriton) per session.

The server runs the repository's own ``triton_models/`` in explicit model-control mode. When the
binary cannot start on a machine, the fixture **fails** with the server's log: these tests never
pass vacuously.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tangram_celery.errors import ServiceError
from tangram_celery.reward.server import TritonServer
from tangram_celery.reward.triton import TritonClient

REPOSITORY = Path(__file__).resolve().parents[2] / "triton_models"


@pytest.fixture(scope="session")
def repository() -> Path:
    """The project's model repository."""
    return REPOSITORY


@pytest.fixture(scope="session")
def triton_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """A real tritonserver on free loopback ports for the whole session, stopped at the end."""
    workdir = tmp_path_factory.mktemp("triton")
    server = TritonServer(REPOSITORY, workdir=workdir)
    try:
        server.start()
    except ServiceError as exc:
        pytest.fail(
            "the real tritonserver (nvidia-pytriton) could not start on this machine, so the "
            f"reward tests cannot run:\n{exc}",
            pytrace=False,
        )
    yield server
    server.stop()
    assert not server.running(), "tritonserver still running after stop()"


@pytest.fixture()
def http_client(triton_server: TritonServer) -> Iterator[TritonClient]:
    """A client of the session server over HTTP."""
    client = TritonClient(triton_server.http_url, "http")
    yield client
    client.close()


@pytest.fixture()
def grpc_client(triton_server: TritonServer) -> Iterator[TritonClient]:
    """A client of the session server over gRPC."""
    client = TritonClient(triton_server.grpc_url, "grpc")
    yield client
    client.close()
