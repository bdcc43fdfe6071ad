"""Who may read ``tangram exporter``: basic auth on a real exporter over HTTP, the loopback rule,
and its request log with tokens masked."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from tangram_celery.credentials import basic_authorization
from tangram_celery.errors import ConfigError
from tangram_celery.observe.metrics import exporter
from tangram_celery.settings import Settings

PASSWORD = "scrape-pw-0123"  # nosec B105 # the test's own exporter password


def get(url: str, authorization: str | None = None) -> tuple[int, dict[str, str], str]:
    """(status, headers, body) of a GET."""
    headers = {"Authorization": authorization} if authorization else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read().decode()


def test_an_exporter_with_a_password_answers_401_without_it(
        settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    guarded = settings.with_(exporter_password=PASSWORD)
    caplog.set_level(logging.DEBUG, logger="tangram_celery.observe.metrics_server")
    with exporter(guarded, port=0) as running:
        status, headers, _ = get(running.url)
        assert status == 401 and headers["WWW-Authenticate"].startswith("Basic ")
        assert get(running.url, basic_authorization("tangram", "wrong"))[0] == 401
        assert get(running.url, basic_authorization("other", PASSWORD))[0] == 401
        status, _, text = get(running.url + "?token=tok-in-the-url",
                              basic_authorization("tangram", PASSWORD))
    assert status == 200 and "tangram_exporter_redis_up" in text
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "token=***" in logged and "tok-in-the-url" not in logged


def test_an_exporter_without_a_password_serves_loopback_only(settings: Settings) -> None:
    with exporter(settings, "127.0.0.1", port=0) as running:
        assert get(running.url)[0] == 200
    with pytest.raises(ConfigError) as refused, \
            exporter(settings, "0.0.0.0", port=0):  # nosec B104 # the address refused
        pytest.fail("the exporter started on 0.0.0.0 without a password")
    assert "refusing to start tangram exporter on 0.0.0.0" in str(refused.value)
    assert "set TANGRAM_EXPORTER_PASSWORD" in str(refused.value)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANGRAM_")}
    done = subprocess.run([sys.executable, "-m", "tangram_celery.cli", "exporter", "--address",
                           "0.0.0.0", "--port", "0"], capture_output=True, text=True,
                          timeout=60, env=env, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("tangram: error: refusing to start tangram exporter")
