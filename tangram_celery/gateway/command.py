"""``tangram gateway`` (also ``python -m tangram_celery.gateway``): serve until stopped.

    tangram gateway [--address 127.0.0.1] [--port 8080] [--check]

verl then points at it: ``sandbox_fusion_url: http://127.0.0.1:8080/run_code``. ``--check``
exits 0 when a gateway answers ``/v1/ping`` at the address (the compose healthcheck).
"""

from __future__ import annotations

import argparse
import signal
import urllib.request
from collections.abc import Sequence

from tangram_celery.command_line import run_with_settings
from tangram_celery.gateway.runtime import Gateway
from tangram_celery.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``tangram gateway``."""
    parser.add_argument("--address", default=None,
                        help="listen address (default TANGRAM_GATEWAY_ADDRESS, 127.0.0.1); off "
                             "loopback, TANGRAM_GATEWAY_TOKEN is required")
    parser.add_argument("--port", type=int, default=None,
                        help="listen port (default TANGRAM_GATEWAY_PORT, 8080)")
    parser.add_argument("--check", action="store_true",
                        help="exit 0 if a gateway answers /v1/ping there, else 1")


def ping(address: str, port: int, timeout: float = 5.0) -> bool:
    """Whether a gateway at ``address:port`` answers ``/v1/ping`` with ``pong``."""
    host = "127.0.0.1" if address in ("0.0.0.0", "") else address  # nosec B104 # the wildcard is reached on loopback
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/v1/ping", timeout=timeout) as reply:  # nosec B310 # our own http URL
            return bool(reply.read().decode().strip().strip('"') == "pong")
    except OSError:
        return False


def run_from_args(settings: Settings, args: argparse.Namespace) -> int:
    """Run ``tangram gateway`` with parsed :func:`add_arguments` until SIGINT or SIGTERM."""
    address = settings.gateway.address if args.address is None else args.address
    port = settings.gateway.port if args.port is None else args.port
    if args.check:
        return 0 if ping(address, port) else 1
    gateway = Gateway(settings, address, port)
    with gateway:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: gateway.request_stop())
        print(f"tangram gateway: serving SandboxFusion's /run_code on {gateway.url} "
              f"(languages: {', '.join(gateway.languages)}; "
              f"token {'required' if settings.gateway.token else 'off'})", flush=True)
        gateway.wait()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m tangram_celery.gateway``."""
    parser = argparse.ArgumentParser(prog="tangram gateway", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run_with_settings(parser, run_from_args, argv)
