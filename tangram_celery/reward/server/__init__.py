"""Launch the real ``tritonserver`` binary that the PyPI package ``nvidia-pytriton`` ships.

``nvidia-pytriton==0.7.0`` carries a Triton Inference Server 2.51 binary with the **python backend
only** (no onnxruntime, pytorch or tensorrt backend), and it runs on CPU-only machines. This package
runs that binary directly on our own model repository (``triton_models/``):

* :mod:`tangram_celery.reward.server.distribution` finds the binary, the python backend and its
  stub, assembles the backend directory and builds the server's environment;
* :mod:`tangram_celery.reward.server.process` is one server process on a repository
  (:class:`TritonServer`: start, readiness, stop);
* :mod:`tangram_celery.reward.server.command` is ``tangram triton``.

Run it from a shell with ``python -m tangram_celery.reward.server --repository triton_models``.
"""

from __future__ import annotations

from tangram_celery.reward.server.distribution import (
    assemble_backends,
    find_distribution,
    server_env,
)
from tangram_celery.reward.server.process import ServerPorts, TritonServer

__all__ = [
    "ServerPorts",
    "TritonServer",
    "assemble_backends",
    "find_distribution",
    "server_env",
]
