"""Launch the real ``tritonserver`` binary that the PyPI package ``nvidia-pytriton`` ships.

``tangram triton`` and ``python -m tangram_celery.reward.server``: a server in the foreground on
the model repository, or (``--check``) whether the one at ``TANGRAM_TRITON_URL`` is ready.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tangram_celery.reward.server.process import ServerPorts, TritonServer, triton_ready


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``tangram triton`` (also ``python -m tangram_celery.reward.server``)."""
    parser.add_argument("--repository", type=Path, default=Path("triton_models"))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--http-port", type=int, default=0)
    parser.add_argument("--grpc-port", type=int, default=0)
    parser.add_argument("--metrics-port", type=int, default=0)
    parser.add_argument("--log", type=Path, default=None, help="log file (default: a temp dir)")
    parser.add_argument("--load", action="append", default=[], help="model to load at start")
    parser.add_argument("--check", action="store_true",
                        help="exit 0 when the server at TANGRAM_TRITON_URL is ready, else 1")


def run_server(args: argparse.Namespace) -> int:
    """Run a server in the foreground until SIGINT or SIGTERM."""
    chosen = (args.http_port, args.grpc_port, args.metrics_port)
    ports = ServerPorts(*chosen) if all(chosen) else None
    server = TritonServer(
        args.repository, host=args.host, ports=ports, log_path=args.log, models=args.load
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with server:
        print(
            f"tritonserver ready: http {server.http_url} grpc {server.grpc_url} "
            f"metrics {server.metrics_url} log {server.log_path}",
            flush=True,
        )
        with contextlib.suppress(KeyboardInterrupt):
            while server.running():
                time.sleep(0.5)
    return 0


def run_from_args(triton_url: str, args: argparse.Namespace) -> int:
    """``tangram triton``: the readiness check against ``triton_url``, or the server."""
    if args.check:
        return 0 if triton_ready(triton_url) else 1
    return run_server(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a server in the foreground until SIGINT or SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m tangram_celery.reward.server",
                                     description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.check:
        from tangram_celery.settings import Settings

        return run_from_args(Settings.from_env().triton_url, args)
    return run_server(args)
