"""Settings: read from TANGRAM_ variables, frozen, typo-proof, and checked."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tangram_celery.errors import ConfigError
from tangram_celery.settings import Settings


def test_defaults_without_environment() -> None:
    settings = Settings.from_env({})
    assert settings.redis_url.startswith("redis://")
    assert settings.result_backend_url == settings.redis_url
    assert settings.visibility_timeout_s > settings.max_timeout_s


def test_reads_typed_values() -> None:
    settings = Settings.from_env({
        "TANGRAM_REDIS_URL": "redis://:pw@10.0.0.1:6380/2",
        "TANGRAM_SANDBOX_PIDS": "32",
        "TANGRAM_MAX_TIMEOUT_S": "120.5",
        "TANGRAM_SANDBOX_ROOT": "/srv/sb",
        "TANGRAM_EXTRA_RESOURCES": "fpga, disk_mb",
        "UNRELATED": "x",
    })
    assert settings.sandbox_pids == 32
    assert settings.max_timeout_s == 120.5
    assert settings.sandbox_root == Path("/srv/sb")
    assert settings.extra_resources == ("fpga", "disk_mb")


def test_frozen() -> None:
    settings = Settings.from_env({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.redis_url = "redis://x"  # type: ignore[misc]


@pytest.mark.parametrize(("env", "words"), [
    ({"TANGRAM_REDIS_URLL": "redis://x"}, "unknown setting(s) TANGRAM_REDIS_URLL"),
    ({"TANGRAM_SANDBOX_PIDS": "many"}, "TANGRAM_SANDBOX_PIDS='many'"),
    ({"TANGRAM_REDIS_URL": "http://x"}, "expected redis://"),
    ({"TANGRAM_SANDBOX_UID_BASE": "0"}, "never run as root"),
    ({"TANGRAM_SANDBOX_READY": "-1"}, "started ahead"),
    ({"TANGRAM_SANDBOX_READY": "65"}, "started ahead"),
    ({"TANGRAM_SANDBOX_BACKEND": "vm"}, "choose 'bwrap' or 'docker'"),
    ({"TANGRAM_DURATIONS_SYNC_S": "-1"}, "each node learns durations alone"),
    ({"TANGRAM_DEFAULT_TIMEOUT_S": "100", "TANGRAM_MAX_TIMEOUT_S": "10"}, "DEFAULT_TIMEOUT_S"),
])
def test_bad_settings_are_named(env: dict[str, str], words: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env(env)
    assert words in str(info.value)


def test_import_connects_to_nothing() -> None:
    import subprocess
    import sys

    code = (
        "import socket\n"
        "def refuse(*a, **k):\n    raise SystemExit('connected at import time')\n"
        "socket.socket.connect = refuse\n"
        "import tangram_celery.client, tangram_celery.tasks.app, tangram_celery.pools.node\n"
        "import tangram_celery.pools.worker, tangram_celery.stack.demo, tangram_celery.cli\n"
        "from tangram_celery.tasks.app import make_app\n"
        "from tangram_celery.settings import Settings\n"
        "make_app(Settings.from_env({}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr


def test_stranded_after_must_cover_the_node_ttl() -> None:
    with pytest.raises(ConfigError, match="TANGRAM_STRANDED_AFTER_S=5 must be 0"):
        Settings.from_env({"TANGRAM_STRANDED_AFTER_S": "5"})
    assert Settings.from_env({"TANGRAM_STRANDED_AFTER_S": "0"}).stranded_after_s == 0
