"""docs/integration.md runs: its tool YAML loads through verl's own loader, and its Python blocks
run against a real Redis and a real CPU node."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from verl.tools.tool_registry import initialize_tools_from_config

from tangram_celery.client import TangramClient
from tangram_celery.integrations.verl import TangramCodeTool
from tangram_celery.settings import Settings

CpuWorkers = Callable[..., list[str]]
PAGE = Path(__file__).resolve().parents[2] / "docs" / "integration.md"


def blocks(language: str) -> list[str]:
    found = re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), re.S)
    assert found, f"docs/integration.md has no {language} block"
    return found


def test_the_tool_yaml_loads_with_verls_loader(tmp_path: Path) -> None:
    [yaml] = blocks("yaml")
    (tmp_path / "tools.yaml").write_text(yaml)
    [tool] = initialize_tools_from_config(str(tmp_path / "tools.yaml"))
    assert isinstance(tool, TangramCodeTool)
    assert (tool.timeout_s, tool.cpu, tool.max_output_chars) == (30, 1, 4000)


@pytest.mark.slow
def test_the_python_blocks_run(settings: Settings, cpu_workers: CpuWorkers,
                               monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                               trl_example: ModuleType, tmp_path: Path) -> None:
    cpu_workers({"docs-a": 2})
    monkeypatch.setenv("TANGRAM_REDIS_URL", settings.broker.redis_url)
    scope: dict[str, Any] = {}
    for block in blocks("python"):
        exec(compile(block, str(PAGE), "exec"), scope)
    assert "[{'score': 1.0, 'passed': 1.0, 'total': 1.0}]" in capsys.readouterr().out
    tokenizer = trl_example.build_tokenizer()
    trainer = scope["make_trainer"](trl_example.build_model(tokenizer), tokenizer,
                                    trl_example.build_dataset(4), str(tmp_path), use_cpu=True)
    assert trainer.reward_func_names == ["tangram_tests"]
    with TangramClient(settings) as client:
        assert scope["rewards"](client, ["x = 1\n", "x = 3\n"], [trl_example.TESTS] * 2) == [
            1.0, 0.5]
        assert scope["tool_call"](client, "docs-tool", "print(6 * 7)").strip() == "42"
        client.end_trajectory("docs-tool")
