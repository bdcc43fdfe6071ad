"""``tangram bench costs`` end to end: a small real run on the local stack and a real Docker
engine writes its section, its JSON and the file the simulator reads, all the same measurement."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import docker_engine
import pytest

from tangram_bench.cli import main
from tangram_bench.costs_report import NAME, section_text


@pytest.fixture(scope="module")
def engine_url() -> Iterator[str]:
    """A Docker engine holding the sandbox image."""
    with docker_engine.engine_with_sandbox_image("costs bench") as url:
        yield url


@pytest.mark.slow
def test_a_small_run_writes_the_section_and_the_sim_file(engine_url: str, tmp_path: Path) -> None:
    sim_file = tmp_path / "measured_costs.json"
    argv = ["costs", "--repeat", "2", "--n", "3", "--docker-url", engine_url,
            "--out", str(tmp_path / "docs"), "--sim-file", str(sim_file)]
    assert main(argv) == 0
    data = json.loads(sim_file.read_text())
    assert data["runs"] == 2 and len(data["per_run"]) == 2
    assert data["command"] == "tangram bench costs " + " ".join(argv[1:])
    for spread in data["figures"].values():
        assert 0 < spread["min"] <= spread["median"] <= spread["max"]
    bench = tmp_path / "docs" / "bench"
    assert json.loads((bench / f"{NAME}.json").read_text()) == data
    assert (bench / f"{NAME}.md").read_text() == section_text(data) + "\n"
    assert f"## {NAME}" in (tmp_path / "docs" / "results.md").read_text()
