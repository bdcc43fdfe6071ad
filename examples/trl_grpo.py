"""A real GRPO training step with TRL, its rewards from unit tests run as tangram actions.

The policy is a tiny causal LM built here from a config (random weights) with a word-level
tokenizer built here too: nothing is downloaded. Each token of its vocabulary is one line of
Python, so a completion is a small program; the dataset's ``tests`` column is a pytest file that
imports it. ``TestReward`` runs every completion's tests of the step at once on the CPU pool.

Run it against a running cluster (``TANGRAM_REDIS_URL`` with live CPU nodes), or on its own: when
no CPU node is registered it starts a local one like ``tangram demo`` does::

    python examples/trl_grpo.py --steps 2
    python examples/trl_grpo.py --steps 3 --compare    # tangram vs the same tests run serially
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from datasets import Dataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    TrainerCallback,
)
from trl import GRPOConfig, GRPOTrainer

from tangram_celery.integrations.trl import TestReward
from tangram_celery.settings import Settings

SPECIAL = ["<pad>", "<eos>", "<unk>"]
PROMPT_WORDS = ["write", "a", "module", "that", "sets", "x", "to", "one", "and", "runs"]
LINES = ["x = 1\n", "x = 2\n", "pass\n", "print(x)\n", "y = x + 1\n", "1 / 0\n", "import os\n"]
TESTS = ("def test_imports():\n    import solution\n\n"
         "def test_x_is_one():\n    import solution\n    assert solution.x == 1\n")


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer: the prompt's words, and one token per line of Python."""
    vocab = {token: i for i, token in enumerate(SPECIAL + PROMPT_WORDS + LINES)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>", bos_token="<eos>")


def build_model(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> LlamaForCausalLM:
    """A 2-layer Llama with hidden size 32 and random weights."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    return LlamaForCausalLM(config)


def build_dataset(prompts: int) -> Dataset:
    """``prompts`` rows of a prompt and the tests that judge its completions."""
    prompt = " ".join(PROMPT_WORDS)
    return Dataset.from_dict({"prompt": [prompt] * prompts, "tests": [TESTS] * prompts})


@dataclass
class TimedReward:
    """Wraps a reward function: keeps every call's completions, rewards and seconds."""

    reward: TestReward
    calls: list[tuple[list[str], list[float], float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.__name__ = self.reward.__name__

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        started = time.perf_counter()
        rewards = self.reward(prompts, completions, **kwargs)
        self.calls.append((list(completions), rewards, time.perf_counter() - started))
        return rewards


class StepTimer(TrainerCallback):  # type: ignore[misc]
    """Wall seconds of each optimizer step (generation, reward, loss and update)."""

    def __init__(self) -> None:
        self.steps: list[float] = []
        self._started = 0.0

    def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
        self._started = time.perf_counter()

    def on_step_end(self, *args: Any, **kwargs: Any) -> None:
        self.steps.append(time.perf_counter() - self._started)


@dataclass
class Run:
    """What one training run measured."""

    reward: TimedReward
    steps: list[float]
    logs: list[dict[str, float]]
    changed: bool


def train(reward: TestReward, steps: int, workdir: Path, group: int = 4, prompts: int = 2,
          completion_tokens: int = 6, seed: int = 0) -> Run:
    """``steps`` GRPO steps of ``prompts x group`` completions each; every step's rewards come
    from ``reward``. Returns the step times, TRL's logs and whether the weights moved."""
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed)
    before = [p.detach().clone() for p in model.parameters()]
    timed, timer = TimedReward(reward), StepTimer()
    config = GRPOConfig(
        output_dir=str(workdir), use_cpu=True, max_steps=steps, learning_rate=5e-2,
        per_device_train_batch_size=prompts * group, num_generations=group,
        max_completion_length=completion_tokens, temperature=1.5, logging_steps=1,
        save_strategy="no", report_to="none", seed=seed, dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[timed],
                          train_dataset=build_dataset(prompts * steps), args=config,
                          callbacks=[timer])
    trainer.train()
    changed = any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters(),
                                                                  strict=True))
    return Run(timed, timer.steps, list(trainer.state.log_history), changed)


def summary(name: str, run: Run) -> str:
    """One line: median step time and median reward time of a run."""
    rewards = [r for _, rs, _ in run.reward.calls for r in rs]
    return (f"{name:>8}: step time median {statistics.median(run.steps):.2f} s "
            f"(steps {', '.join(f'{s:.2f}' for s in run.steps)}), reward time median "
            f"{statistics.median(c[2] for c in run.reward.calls):.2f} s, mean reward "
            f"{statistics.fmean(rewards):.2f}")


def main() -> int:
    """Train, print the step times; with ``--compare``, also the serial in-process reward."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from grpo_step import cluster

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--group", type=int, default=4, help="completions per prompt")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step")
    parser.add_argument("--compare", action="store_true",
                        help="also train with the same tests run serially in this process")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--cores", type=int, default=2)
    args = parser.parse_args()
    with cluster(Settings.from_env(), args.nodes, args.cores) as settings, \
            tempfile.TemporaryDirectory(prefix="tangram-trl-") as work:
        runs = {"tangram": train(TestReward(settings=settings), args.steps, Path(work),
                                 args.group, args.prompts)}
        if args.compare:
            runs["serial"] = train(TestReward(serial=True), args.steps, Path(work), args.group,
                                   args.prompts)
    for name, run in runs.items():
        print(summary(name, run))
    if args.compare:
        ratio = statistics.median(runs["serial"].steps) / statistics.median(runs["tangram"].steps)
        print(f"step time serial / tangram: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
