"""Fixtures of the reward tests, over the session's real ``tritonserver``.

The server itself is the ``triton_server`` fixture of ``tests/conftest.py`` (shared with the GPU
pool tests): the repository's own ``triton_models/`` in explicit model-control mode, failing
loudly (never passing vacuously) when the binary cannot start on a machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tangram_celery.reward.server import TritonServer
from tangram_celery.reward.triton import TritonClient

REPOSITORY = Path(__file__).resolve().parents[2] / "triton_models"


@pytest.fixture(scope="session")
def repository() -> Path:
    """The project's model repository."""
    return REPOSITORY


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
