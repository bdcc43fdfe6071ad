"""Every command ends the same way: its exit status, or one line naming a TangramError."""

from __future__ import annotations

import argparse

import pytest

from tangram_celery.command_line import USAGE_ERROR, run_command, run_with_settings
from tangram_celery.errors import ConfigError, ServiceError
from tangram_celery.settings import Settings


def test_a_command_returns_its_status_and_none_is_success() -> None:
    assert run_command("x", lambda: 3) == 3
    assert run_command("x", lambda: None) == 0


def test_a_tangram_error_is_one_line_and_exit_two(capsys: pytest.CaptureFixture[str]) -> None:
    def fail() -> int:
        raise ServiceError("Redis at 127.0.0.1:1 refused the connection: start it")

    assert run_command("tangram status", fail) == USAGE_ERROR == 2
    err = capsys.readouterr().err
    assert err == "tangram status: error: Redis at 127.0.0.1:1 refused the connection: start it\n"


def test_a_bug_keeps_its_traceback() -> None:
    def bug() -> int:
        raise KeyError("internal")

    with pytest.raises(KeyError):
        run_command("x", bug)


def test_a_bad_setting_ends_a_settings_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TANGRAM_NODE_TTL_Z", "1")
    seen: list[Settings] = []
    parser = argparse.ArgumentParser(prog="tangram thing")
    assert run_with_settings(parser, lambda s, a: seen.append(s), []) == 2
    assert not seen
    assert "tangram thing: error: unknown setting(s) TANGRAM_NODE_TTL_Z" in capsys.readouterr().err


def test_a_settings_command_gets_the_settings_and_its_arguments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TANGRAM_NODE_TTL_S", "7")
    parser = argparse.ArgumentParser(prog="tangram thing")
    parser.add_argument("--n", type=int)
    got: list[tuple[float, int]] = []

    def run(settings: Settings, args: argparse.Namespace) -> int:
        got.append((settings.node.ttl_s, args.n))
        return 0

    assert run_with_settings(parser, run, ["--n", "4"]) == 0
    assert got == [(7.0, 4)]
    with pytest.raises(ConfigError):
        Settings.from_env({"TANGRAM_NODE_TTL_Z": "1"})
