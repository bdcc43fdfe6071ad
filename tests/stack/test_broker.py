"""``tangram redis`` refuses to listen off loopback without a password."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tangram_celery.errors import ConfigError
from tangram_celery.stack.broker import check_bind


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
