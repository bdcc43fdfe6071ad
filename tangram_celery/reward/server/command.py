"""Launch the real ``tritonserver`` binary that the PyPI package ``nvidia-pytriton`` ships.

``tangram triton`` and ``python -m tangram_celery.reward.server``: a server in the foreground on
the model repository, or (``--check``) whether the one at ``TANGRAM_TRITON_URL`` is ready. The
server's control APIs take ``TANGRAM_TRITON_KEY`` (from the environment, never an argument);
``--host`` off loopback is refused without it.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tangram_celery.command_line import run_with_settings
from tangram_celery.reward.server.process import ServerPorts, TritonServer, triton_ready
from tangram_celery.settings import TritonSettings


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


def run_server(args: argparse.Namespace, key: str = "") -> int:
    """Run a server in the foreground until SIGINT or SIGTERM (``key``: its control APIs')."""
    chosen = (args.http_port, args.grpc_port, args.metrics_port)
    ports = ServerPorts(*chosen) if all(chosen) else None
    server = TritonServer(
        args.repository, host=args.host, ports=ports, log_path=args.log, models=args.load,
        key=key,
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with server:
        print(
            f"tritonserver ready: http {server.http_url} grpc {server.grpc_url} "
            f"metrics {server.metrics_url} log {server.log_path}; {access(server)}",
            flush=True,
        )
        with contextlib.suppress(KeyboardInterrupt):
            while server.running():
                time.sleep(0.5)
    return 0


def access(server: TritonServer) -> str:
    """How the server's control APIs are guarded, for its start line."""
    if not server.key:
        return "control APIs open (no TANGRAM_TRITON_KEY: loopback only)"
    hidden = "hidden from ps" if server.key_hidden else "could not be hidden from ps"
    return f"control APIs need TANGRAM_TRITON_KEY (the key {hidden})"


def run_from_args(triton: TritonSettings, args: argparse.Namespace) -> int:
    """``tangram triton``: the readiness check against ``TANGRAM_TRITON_URL``, or the server
    with ``TANGRAM_TRITON_KEY``."""
    if args.check:
        return 0 if triton_ready(triton.url) else 1
    return run_server(args, triton.key)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a server in the foreground until SIGINT or SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m tangram_celery.reward.server",
                                     description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run_with_settings(parser, lambda settings, args: run_from_args(settings.triton, args),
                             argv)
