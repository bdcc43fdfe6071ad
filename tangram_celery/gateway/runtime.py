"""A running gateway: the HTTP server, its service, its presence in Redis and the idle reaper.

:class:`Gateway` is a context manager (also used by the tests and ``tangram bench gateway``):
it refuses an address off loopback without a token, starts the server on a thread, publishes
``address``, ``served`` and ``in_flight`` under :data:`~tangram_celery.keys.GATEWAYS` every few
seconds (what ``tangram status`` shows), and ends named trajectories that went idle.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from tangram_celery import keys
from tangram_celery.client import TangramClient
from tangram_celery.connection import connect
from tangram_celery.credentials import require_credential
from tangram_celery.gateway.languages import available, on_path
from tangram_celery.gateway.reward import RewardService
from tangram_celery.gateway.server import GatewayHTTPServer, serve_in_thread
from tangram_celery.gateway.service import RunCodeService
from tangram_celery.settings import Settings

log = logging.getLogger(__name__)
PRESENCE_INTERVAL_S = 2.0


def check_exposure(address: str, token: str) -> None:
    """Raise :class:`ConfigError` for an address off loopback without a bearer token."""
    require_credential(
        address, token, "tangram gateway",
        "set TANGRAM_GATEWAY_TOKEN (clients send 'Authorization: Bearer <token>')")


class Gateway:
    """``tangram gateway`` in this process: ``with Gateway(settings) as gw: gw.url``."""

    def __init__(self, settings: Settings, address: str | None = None,
                 port: int | None = None) -> None:
        self.settings = settings
        self.address = settings.gateway.address if address is None else address
        self.port = settings.gateway.port if port is None else port
        check_exposure(self.address, settings.gateway.token)
        self.languages = available(on_path, settings.gateway.languages)
        self.client: TangramClient | None = None
        self.service: RunCodeService | None = None
        self.server: GatewayHTTPServer | None = None
        self._stop_http: Callable[[], None] = _nothing
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._redis: redis.Redis | None = None
        self.name = ""

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` it serves on (the bound port when 0 was asked)."""
        assert self.server is not None, "the gateway is not started"
        return self.server.url

    def __enter__(self) -> Gateway:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Bind, serve and start publishing; raises ``OSError`` when the port is taken."""
        self.client = TangramClient(self.settings, memory_wait_s=self.settings.gateway.wait_s)
        self.service = RunCodeService(self.settings, self.client, self.languages)
        try:
            rewards = RewardService(self.client, self.settings.gateway.reward_model,
                                    self.settings.gateway.wait_s)
            self.server = GatewayHTTPServer((self.address, self.port), self.service,
                                            self.settings.gateway.token, rewards)
        except OSError:
            self.client.close()
            raise
        self.name = f"{socket.gethostname()}:{self.server.server_address[1]}"
        self._redis = connect(self.settings.broker)
        self._stop_http = serve_in_thread(self.server)
        self._ticker = threading.Thread(target=self._tick_forever, name="tangram-gateway-tick",
                                        daemon=True)
        self._ticker.start()

    def stop(self) -> None:
        """Stop serving, end the kept trajectories, withdraw from Redis, close the client."""
        self._stop.set()
        self._stop_http()
        if self._ticker is not None:
            self._ticker.join(10)
        if self.service is not None:
            for trajectory_id in self.service.kept():
                self.service.end(trajectory_id.removeprefix("gw:"))
            self.service.close()
        if self.client is not None:
            self._withdraw()
            self.client.close()

    def request_stop(self) -> None:
        """Make :meth:`wait` return (safe from a signal handler)."""
        self._stop.set()

    def wait(self) -> None:
        """Block until :meth:`stop` is called (from a signal handler, say)."""
        self._stop.wait()

    def presence(self) -> dict[str, Any]:
        """What the gateway publishes about itself."""
        service = self.service
        return {"address": self.url, "served": service.served if service else 0,
                "in_flight": service.in_flight if service else 0,
                "languages": list(self.languages), "at": time.time()}

    def _tick_forever(self) -> None:
        while not self._stop.is_set():
            self._publish()
            if self.service is not None:
                self.service.reap_idle()
            self._stop.wait(PRESENCE_INTERVAL_S)

    def _publish(self) -> None:
        assert self._redis is not None
        try:
            self._redis.hset(keys.GATEWAYS, self.name, json.dumps(self.presence()))
        except (redis.RedisError, OSError):
            log.warning("gateway %s could not publish its presence", self.name, exc_info=True)

    def _withdraw(self) -> None:
        if self._redis is None:
            return
        try:
            self._redis.hdel(keys.GATEWAYS, self.name)
        except (redis.RedisError, OSError):
            log.warning("gateway %s could not withdraw from %s", self.name, keys.GATEWAYS)
        finally:
            self._redis.close()


def _nothing() -> None:
    return None
