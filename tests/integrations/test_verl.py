"""verl's own classes drive the adapters: its tool loader builds the tool from a YAML config, and
its batch reward manager scores a DataProto, on a real Redis and a real CPU node."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
from verl.tools.tool_registry import initialize_tools_from_config
from verl.workers.reward_manager import get_reward_manager_cls

from tangram_celery.integrations.verl import TangramCodeTool, compute_score, compute_score_async
from tangram_celery.settings import Settings

CpuWorkers = Callable[..., list[str]]

pytestmark = pytest.mark.slow

TOOL_YAML = """\
tools:
  - class_name: tangram_celery.integrations.verl.TangramCodeTool
    config:
      type: native
      timeout_s: 5
      max_output_chars: 200
      settings: {{redis_url: "{redis_url}"}}
"""


def load_tool(settings: Settings, tmp_path: Path, extra: str = "") -> TangramCodeTool:
    config = tmp_path / "tools.yaml"
    config.write_text(TOOL_YAML.format(redis_url=settings.broker.redis_url) + extra)
    [tool] = initialize_tools_from_config(str(config))
    assert isinstance(tool, TangramCodeTool) and tool.name == "code_interpreter"
    return tool


def test_the_tool_keeps_an_instances_files_and_frees_them(
        settings: Settings, cpu_workers: CpuWorkers, tmp_path: Path) -> None:
    cpu_workers({"verl-a": 2})
    tool = load_tool(settings, tmp_path)

    async def session() -> list[str]:
        first, _ = await tool.create()
        other, _ = await tool.create()
        wrote, reward, metrics = await tool.execute(
            first, {"code": "open('notes.txt', 'w').write('kept'); print('wrote')"})
        assert reward == 0.0 and metrics["status"] == "ok" and metrics["act_s"] > 0
        read, _, _ = await tool.execute(first, {"code": "print(open('notes.txt').read())"})
        missing, _, failed = await tool.execute(other, {"code": "open('notes.txt')"})
        slow, _, timed_out = await tool.execute(other, {"code": "import time; time.sleep(30)"})
        bad, _, _ = await tool.execute(first, {"path": "x"})
        await tool.release(first)
        await tool.release(other)
        gone, _, _ = await tool.execute(first, {"code": "print(1)"})
        assert failed["status"] == "failed" and timed_out["status"] == "timeout"
        return [str(r.text) for r in (wrote, read, missing, slow, bad, gone)]

    wrote, read, missing, slow, bad, gone = asyncio.run(session())
    assert wrote.strip() == "wrote" and read.strip() == "kept"
    assert "FileNotFoundError" in missing and "timed out after 5 s" in slow
    assert "'code'" in bad and "call create first" in gone


def test_a_session_tool_keeps_variables_imports_and_cwd_across_calls(
        settings: Settings, cpu_workers: CpuWorkers, tmp_path: Path) -> None:
    cpu_workers({"verl-s": 2})
    tool = load_tool(settings, tmp_path, "      session: true\n")

    async def calls() -> list[str]:
        first, _ = await tool.create()
        other, _ = await tool.create()
        texts = []
        for instance, code in (
                (first, "import math\nx = 6 * 7\nimport os; os.mkdir('d'); os.chdir('d')"),
                (first, "print(x, math.pi > 3, os.getcwd())"),
                (first, "x + 1"),
                (other, "print('x' in globals())"),
                (first, "import time; time.sleep(30)"),
                (first, "print('x' in globals())")):
            response, _, _ = await tool.execute(instance, {"code": code})
            texts.append(str(response.text))
        await tool.release(first)
        await tool.release(other)
        return texts

    made, used, shown, apart, slow, after = asyncio.run(calls())
    assert made == "" and used.strip() == "42 True /work/d" and shown.strip() == "43"
    assert apart.strip() == "False" and "timed out" in slow
    assert "had died" in after and after.startswith("False")


def data_proto(tokenizer: Any, solutions: list[list[str]], truths: list[object]) -> DataProto:
    """A batch as verl's rollout hands it over: prompt and response ids, and the dataset's
    ground truth; each solution is a list of the tokenizer's one-line tokens."""
    rows = [list(tokenizer.convert_tokens_to_ids(lines)) or [tokenizer.eos_token_id]
            for lines in solutions]
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    responses = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    prompts = torch.full((len(rows), 2), pad)
    mask = torch.cat([torch.ones_like(prompts),
                      torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])], 1)
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "attention_mask": mask},
        non_tensors={"data_source": np.array(["tangram-code"] * len(rows), dtype=object),
                     "reward_model": np.array([{"ground_truth": t} for t in truths], dtype=object),
                     "extra_info": np.array([{"index": i} for i in range(len(rows))],
                                            dtype=object)})


def test_verls_batch_reward_manager_scores_with_tangram(
        settings: Settings, cpu_workers: CpuWorkers, trl_example: ModuleType) -> None:
    cpu_workers({"verl-b": 2})
    tokenizer = trl_example.build_tokenizer()
    stdio = json.dumps({"inputs": ["", ""], "outputs": ["1", "1"]})
    solutions = [["x = 1\n"], ["x = 2\n"], ["1 / 0\n"], ["x = 1\n", "print(x)\n"],
                 ["print(x)\n"], []]
    truths = [trl_example.TESTS] * 3 + [stdio, stdio, trl_example.TESTS]
    manager = get_reward_manager_cls("batch")(
        tokenizer=tokenizer, num_examine=0, compute_score=compute_score,
        settings={"redis_url": settings.broker.redis_url}, timeout_s=30)
    out = manager(data_proto(tokenizer, solutions, truths), return_dict=True)
    rewards = out["reward_tensor"].sum(dim=1).tolist()
    assert rewards == [1.0, 0.5, 0.0, 1.0, 0.0, 0.0]
    assert out["reward_extra_info"]["total"] == [2.0, 2.0, 2.0, 2.0, 2.0, 1.0]


def test_compute_score_names_bad_ground_truth(settings: Settings) -> None:
    with pytest.raises(ValueError, match="tests"):
        compute_score(["d"], ["x = 1"], [{"inputs": ["1"]}], [{}],
                      settings={"redis_url": settings.broker.redis_url})


def test_verls_reward_loop_manager_awaits_the_per_sample_form(
        settings: Settings, cpu_workers: CpuWorkers, trl_example: ModuleType) -> None:
    cpu_workers({"verl-c": 2})
    tokenizer = trl_example.build_tokenizer()
    score = partial(compute_score_async, settings={"redis_url": settings.broker.redis_url})
    manager = NaiveRewardManager(OmegaConf.create({}), tokenizer, score)
    batch = data_proto(tokenizer, [["x = 1\n"], ["x = 2\n"]], [trl_example.TESTS] * 2)

    async def both() -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(manager.run_single(batch[i:i + 1]) for i in (0, 1))))

    assert [r["reward_score"] for r in manager.loop.run_until_complete(both())] == [1.0, 0.5]
