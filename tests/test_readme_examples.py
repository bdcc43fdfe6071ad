"""The Python examples a newcomer copies first (the README's and the architecture page's) run
as printed, against a real Redis and a real CPU node."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tangram_celery.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
CpuWorkers = Callable[..., list[str]]


def python_blocks(page: Path) -> list[str]:
    """The fenced ``python`` blocks of a Markdown page."""
    found = re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M)
    assert found, f"{page.name} has no python block"
    return found


def run_blocks(page: Path) -> None:
    for block in python_blocks(page):
        exec(compile(block, str(page), "exec"), {"__name__": "__example__"})


@pytest.fixture()
def on_a_node(settings: Settings, cpu_workers: CpuWorkers,
              monkeypatch: pytest.MonkeyPatch) -> None:
    """A real 2-core CPU node, and ``TANGRAM_REDIS_URL`` naming its Redis, as a user sets it."""
    cpu_workers({"examples-a": 2})
    monkeypatch.setenv("TANGRAM_REDIS_URL", settings.broker.redis_url)


@pytest.mark.slow
@pytest.mark.usefixtures("on_a_node")
def test_the_readme_client_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    run_blocks(ROOT / "README.md")
    first, act, last = capsys.readouterr().out.splitlines()
    assert first == "ok 42", "print(6 * 7) ran and its stdout came back"
    parts = ast.literal_eval(act)
    assert set(parts) == {"queue", "exec", "overhead", "total"} and parts["exec"] > 0
    assert re.fullmatch(r"ok 1 passed in [0-9.]+s", last), last


@pytest.mark.slow
@pytest.mark.usefixtures("on_a_node")
def test_the_asyncio_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    run_blocks(ROOT / "docs" / "architecture.md")
    assert capsys.readouterr().out.splitlines() == ["['0', '1', '4', '9']", "ok True"]
