"""``tangram redis`` refuses to listen off loopback without a password; a private server takes
its password on stdin, never on its command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tangram_celery.errors import ConfigError
from tangram_celery.stack.broker import check_bind, embedded_redis, redis_answers


@pytest.mark.parametrize(("url", "bind"), [
    ("redis://127.0.0.1:6379/0", "127.0.0.1"),
    ("redis://127.0.0.1:6379/0", "127.0.0.1 ::1"),
    ("redis://:pw@10.77.0.1:6379/0", "10.77.0.1"),
    ("redis://:pw@redis:6379/0", "0.0.0.0"),
])
def test_loopback_or_a_password_may_listen(url: str, bind: str) -> None:
    check_bind(url, bind)


@pytest.mark.parametrize("bind", ["0.0.0.0", "10.77.0.1", "127.0.0.1 10.77.0.1"])
def test_off_loopback_without_a_password_is_refused(bind: str) -> None:
    with pytest.raises(ConfigError, match="password"):
        check_bind("redis://10.77.0.1:6379/0", bind)


def test_the_command_refuses_before_starting_a_server() -> None:
    env = {**os.environ, "TANGRAM_REDIS_URL": "redis://127.0.0.1:6399/0"}
    done = subprocess.run([sys.executable, "-m", "tangram_celery.cli", "redis", "--bind",
                           "0.0.0.0"], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode != 0
    assert "without a password" in done.stderr


def test_a_private_servers_password_is_not_on_its_command_line() -> None:
    password = "pw-on-stdin-0123456789"  # nosec B105 # the test server's own password
    with embedded_redis(password=password) as server:
        assert server.pid is not None
        cmdline = Path(f"/proc/{server.pid}/cmdline").read_bytes()
        assert b"redis-server" in cmdline and password.encode() not in cmdline
        assert redis_answers(server.url)
        anonymous = redis.Redis(port=server.port, socket_timeout=2)
        with pytest.raises(redis.AuthenticationError):
            anonymous.ping()
        anonymous.close()
