"""The TRL example as a module: its tiny model, tokenizer and training loop are what tests run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl_grpo.py"


@pytest.fixture(scope="session")
def trl_example() -> ModuleType:
    """``examples/trl_grpo.py``, imported (it builds everything locally, no downloads)."""
    spec = importlib.util.spec_from_file_location("trl_grpo_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
