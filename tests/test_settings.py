"""Settings: read from TANGRAM_ variables, frozen, typo-proof, and checked."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tangram_celery.errors import ConfigError
from tangram_celery.scheduling.malleable import WEIGHTINGS as POLICY_WEIGHTINGS
from tangram_celery.settings import SECTIONS, VARIABLES, SandboxSettings, Settings, variable
from tangram_celery.settings.runtime import WEIGHTINGS


def test_defaults_without_environment() -> None:
    settings = Settings.from_env({})
    assert settings.broker.redis_url.startswith("redis://")
    assert settings.broker.result_backend_url == settings.broker.redis_url
    assert settings.visibility_timeout_s > settings.actions.max_timeout_s


def test_reads_typed_values() -> None:
    settings = Settings.from_env({
        "TANGRAM_REDIS_URL": "redis://:pw@10.0.0.1:6380/2",
        "TANGRAM_SANDBOX_PIDS": "32",
        "TANGRAM_MAX_TIMEOUT_S": "120.5",
        "TANGRAM_SANDBOX_ROOT": "/srv/sb",
        "TANGRAM_EXTRA_RESOURCES": "fpga, disk_mb",
        "UNRELATED": "x",
    })
    assert settings.sandbox.pids == 32
    assert settings.actions.max_timeout_s == 120.5
    assert settings.sandbox.root == Path("/srv/sb")
    assert settings.actions.extra_resources == ("fpga", "disk_mb")


def test_frozen() -> None:
    settings = Settings.from_env({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.broker.redis_url = "redis://x"  # type: ignore[misc]


@pytest.mark.parametrize(("env", "words"), [
    ({"TANGRAM_REDIS_URLL": "redis://x"}, "unknown setting(s) TANGRAM_REDIS_URLL"),
    ({"TANGRAM_SANDBOX_PIDS": "many"}, "TANGRAM_SANDBOX_PIDS='many'"),
    ({"TANGRAM_REDIS_URL": "http://x"}, "expected redis://"),
    ({"TANGRAM_SANDBOX_UID_BASE": "0"}, "never run as root"),
    ({"TANGRAM_SANDBOX_READY": "-1"}, "started ahead"),
    ({"TANGRAM_SANDBOX_READY": "65"}, "started ahead"),
    ({"TANGRAM_SANDBOX_BACKEND": "vm"}, "choose 'bwrap' or 'docker'"),
    ({"TANGRAM_DURATIONS_SYNC_S": "-1"}, "each node learns durations alone"),
    ({"TANGRAM_TRITON_KEY": "a:b=c"}, "it travels as an HTTP header value"),
    ({"TANGRAM_EXPORTER_USER": "a:b"}, "TANGRAM_EXPORTER_USER must be non-empty, without ':'"),
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
        "import tangram_celery.client, tangram_celery.tasks.app\n"
        "import tangram_celery.pools.cpu_pool.node, tangram_celery.pools.cpu_pool.worker\n"
        "import tangram_celery.stack.demo, tangram_celery.cli\n"
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
    assert Settings.from_env({"TANGRAM_STRANDED_AFTER_S": "0"}).client.stranded_after_s == 0


def test_every_variable_has_one_field_in_one_section() -> None:
    defaults = Settings()
    section_fields = [(s, f.name) for s in SECTIONS
                      for f in dataclasses.fields(getattr(defaults, s))]
    assert sorted(VARIABLES.values()) == sorted(section_fields)
    assert len(VARIABLES) == len(section_fields) > 70, "one variable per field, none shared"
    assert VARIABLES["redis_url"] == ("broker", "redis_url")
    assert VARIABLES["sandbox_memory_mb"] == ("sandbox", "memory_mb")
    assert VARIABLES["output_cap_bytes"] == ("sandbox", "output_cap_bytes")
    assert VARIABLES["node_ttl_s"] == ("node", "ttl_s")
    assert variable("gateway_token") == "TANGRAM_GATEWAY_TOKEN"


def test_overrides_and_changes_name_variables_and_land_in_their_section() -> None:
    settings = Settings.from_env({"TANGRAM_SANDBOX_PIDS": "32"}, sandbox_pids=16,
                                 gateway_port=9000, node_ttl_s=12.0)
    assert (settings.sandbox.pids, settings.gateway.port, settings.node.ttl_s) == (16, 9000, 12)
    changed = settings.with_(sandbox_memory_mb=1024)
    assert changed.sandbox.memory_mb == 1024 and changed.sandbox.pids == 16
    assert settings.sandbox.memory_mb == 512, "with_ returns a copy"
    assert changed.gateway is settings.gateway, "untouched sections are shared, not copied"
    with pytest.raises(ConfigError, match="unknown setting\\(s\\) memory_mb"):
        settings.with_(memory_mb=1)
    with pytest.raises(ConfigError, match="TANGRAM_SANDBOX_UID_BASE=0"):
        settings.with_(sandbox_uid_base=0)


def test_a_section_is_all_a_component_needs() -> None:
    sandbox = Settings.from_env({"TANGRAM_SANDBOX_BACKEND": "docker"}).sandbox
    assert isinstance(sandbox, SandboxSettings)
    assert sandbox.backend == "docker"
    with pytest.raises(dataclasses.FrozenInstanceError):
        sandbox.backend = "bwrap"  # type: ignore[misc]


def test_the_weighting_setting_offers_the_policys_weightings() -> None:
    assert set(WEIGHTINGS) == set(POLICY_WEIGHTINGS)
