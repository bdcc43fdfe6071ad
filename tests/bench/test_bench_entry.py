"""``tangram bench`` reaches the bench through its entry point, and says which extra to install
when the bench or what it needs is missing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tangram_celery import cli


def run_cli(prelude: str, *argv: str) -> subprocess.CompletedProcess[str]:
    script = (f"import sys\n{prelude}\nfrom tangram_celery.cli import main\n"
              f"sys.exit(main({list(argv)!r}))")
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=False)


def test_bench_runs_when_the_extra_is_installed() -> None:
    done = run_cli("", "bench", "coding", "--help")
    assert done.returncode == 0, done.stderr
    assert "--mode" in done.stdout


def test_without_matplotlib_the_verb_names_the_extra() -> None:
    done = run_cli("sys.modules['matplotlib'] = None", "bench", "overhead", "--json")
    assert done.returncode == 2
    assert "matplotlib" in done.stderr and "pip install 'tangram-celery[bench]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_without_the_bench_the_verb_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "entry_points", lambda group: [])
    assert cli.main(["bench", "coding", "--mode", "sim"]) == 2
    assert "pip install 'tangram-celery[bench]'" in capsys.readouterr().err


def test_the_bench_verb_is_listed_in_help() -> None:
    assert "bench" in cli.build_parser().format_help()
