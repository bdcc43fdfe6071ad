"""Credentials of tangram's servers (`tangram_celery.credentials`): the loopback rule, basic auth,
secrets masked in log lines and blanked in a running child's command line."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tangram_celery.credentials import (
    authorized,
    basic_authorization,
    hide_argument,
    is_loopback,
    redact,
    require_credential,
)
from tangram_celery.errors import ConfigError


def test_loopback_addresses() -> None:
    assert all(map(is_loopback, ["127.0.0.1", "127.9.0.1", "::1", "localhost"]))
    assert not any(map(is_loopback, ["", "0.0.0.0", "::", "10.0.0.5", "example.org"]))


@pytest.mark.parametrize(("address", "credential", "refused"), [
    ("127.0.0.1", "", False),
    ("::1", "", False),
    ("0.0.0.0", "", True),
    ("", "", True),
    ("10.1.2.3", "", True),
    ("0.0.0.0", "s3cret", False),
])
def test_a_server_off_loopback_needs_a_credential(address: str, credential: str,
                                                  refused: bool) -> None:
    if not refused:
        require_credential(address, credential, "the thing", "set TANGRAM_THING")
        return
    with pytest.raises(ConfigError) as error:
        require_credential(address, credential, "the thing", "set TANGRAM_THING")
    assert str(error.value).startswith(f"refusing to start the thing on {address or '*'} ")
    assert "set TANGRAM_THING, or listen on 127.0.0.1" in str(error.value)


def test_basic_auth_header_and_comparison() -> None:
    header = basic_authorization("tangram", "pw")
    assert header == "Basic dGFuZ3JhbTpwdw=="
    assert authorized(header, header)
    assert not authorized(None, header) and not authorized("Basic x", header)


@pytest.mark.parametrize(("line", "expected"), [
    ('"POST /run_code?token=abc123 HTTP/1.1" 200 -', '"POST /run_code?token=*** HTTP/1.1" 200 -'),
    ("GET /x?a=1&TOKEN=abc&b=2", "GET /x?a=1&TOKEN=***&b=2"),
    ("url=/v?key=zz password=hunter2", "url=/v?key=*** password=***"),
    ("broker redis://:pw0rd@10.0.0.1:6379/0 down", "broker redis://:***@10.0.0.1:6379/0 down"),
    ("redis://user:pw@h/0", "redis://user:***@h/0"),
    ("redis://10.0.0.1:6379/0 and /run_code?x=1", "redis://10.0.0.1:6379/0 and /run_code?x=1"),
])
def test_redact_masks_secrets_in_urls(line: str, expected: str) -> None:
    assert redact(line) == expected


def test_a_secret_is_blanked_in_a_running_childs_command_line() -> None:
    secret = "s3cret-in-argv-0123"
    child = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(30)",
                              f"--key={secret}", secret])
    try:
        cmdline = Path(f"/proc/{child.pid}/cmdline")
        deadline = time.monotonic() + 10
        while secret.encode() not in cmdline.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert hide_argument(child.pid, secret)
        shown = cmdline.read_bytes().split(b"\0")
        assert shown[-3:] == [f"--key={'*' * len(secret)}".encode(), b"*" * len(secret), b""]
        assert not hide_argument(child.pid, secret)  # nothing left to blank
        assert not hide_argument(child.pid, "")
    finally:
        child.kill()
        child.wait()
    assert not hide_argument(child.pid, secret)  # gone: nothing to do, no error
