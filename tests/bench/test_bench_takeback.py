"""``tangram bench takeback`` end to end: a real malleable run in the bubblewrap sandbox and in a
real Docker container, a core taken back in each order, and the section it publishes."""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import docker_engine
import pytest

from tangram_bench.cli import main
from tangram_bench.takeback import NAME

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPU cores")]


@pytest.fixture(scope="module")
def engine_url() -> Iterator[str]:
    """A Docker engine holding the sandbox image."""
    with docker_engine.engine_with_sandbox_image("takeback bench") as url:
        yield url


def test_each_backend_takes_a_core_back_in_both_orders(engine_url: str, tmp_path: Path) -> None:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["takeback", "--cycles", "2", "--docker-url", engine_url, "--json"]) == 0
    found = json.loads(printed.getvalue())
    assert found["missing"] == []
    assert [row["backend"] for row in found["rows"]] == ["bwrap", "docker"]
    for row in found["rows"]:
        assert len(row["samples"]["take_first_s"]) == len(row["samples"]["ask_first_s"]) == 2
        assert row["take_first_s"] > 0 and row["ask_first_s"] > 0
        assert row["ratio"] == row["ask_first_s"] / row["take_first_s"]
    assert main(["takeback", "--cycles", "1", "--docker-url", engine_url,
                 "--out", str(tmp_path / "docs")]) == 0
    section = (tmp_path / "docs" / "bench" / f"{NAME}.md").read_text()
    assert section.startswith(f"## {NAME}\n\nCommand: `tangram bench takeback --cycles 1")
    assert "| bwrap | 1 |" in section and "| docker | 1 |" in section
