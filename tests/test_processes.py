"""Helpers for child processes and ports (`tangram_celery.processes`)."""

from __future__ import annotations

import socket

from tangram_celery.processes import free_ports
from tangram_celery.reward.server.process import ServerPorts


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(64)
    assert len(set(ports)) == 64
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", ports[0]))


def test_a_triton_server_is_given_three_distinct_ports() -> None:
    for _ in range(200):
        ports = ServerPorts.pick()
        assert len({ports.http, ports.grpc, ports.metrics}) == 3, ports
