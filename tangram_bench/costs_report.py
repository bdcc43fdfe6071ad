"""The pure side of ``tangram bench costs``: each run's measurement, the median and range over
runs, the file the simulator reads its costs from, and the report section (no I/O)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tangram_bench.sim.costs import charged_costs, ms, span

NAME = "sim-costs"
"""The section's name: ``docs/bench/sim-costs.md`` and ``.json``."""


@dataclass(frozen=True)
class Run:
    """The medians (seconds) of one run: a trivial ``true`` action through the whole stack
    (its ACT and the exec part of it), and a warm container's ``exec_run(["true"])`` and a
    ``containers.run(..., remove=True)`` start through the Docker SDK."""

    act_s: float
    exec_s: float
    docker_exec_s: float
    docker_run_s: float

    @property
    def dispatch_s(self) -> float:
        """Tangram's own per-action cost: the ACT less the command's own run."""
        return self.act_s - self.exec_s


@dataclass(frozen=True)
class Spread:
    """Median, least and greatest of one figure over the runs (seconds)."""

    median: float
    min: float
    max: float


FIGURES: dict[str, str] = {
    "dispatch_s": "a trivial sandboxed action's ACT less its exec (queue hand-off, broker, "
                  "sandbox set-up, result path)",
    "exec_latency_s": "`exec_run(['true'])` in a warm container through the Docker SDK",
    "docker_run_s": "`containers.run(image, ['true'], remove=True)`: a container's start to "
                    "its removal",
    "act_s": "the trivial action's whole ACT",
    "exec_s": "the trivial action's exec part",
}
"""Each figure the command reports, in the order of its table."""
def figure(run: Run, name: str) -> float:
    """One of :data:`FIGURES` for ``run``."""
    return run.docker_exec_s if name == "exec_latency_s" else float(getattr(run, name))


def spread(values: Sequence[float]) -> Spread:
    """The median and range of ``values``, rounded to the millisecond's tenth."""
    if not values:
        raise ValueError("no runs to summarise")
    return Spread(round(statistics.median(values), 4), round(min(values), 4),
                  round(max(values), 4))


def measured(runs: Sequence[Run], command: str, when: str, machine: str) -> dict[str, Any]:
    """The file the simulator reads (``tangram_bench/sim/measured_costs.json``): every
    figure's spread over ``runs``, the command that measured them, when and where."""
    return {
        "command": command,
        "date": when,
        "machine": machine,
        "runs": len(runs),
        "section": f"docs/bench/{NAME}.md",
        "figures": {name: asdict(spread([figure(r, name) for r in runs])) for name in FIGURES},
        "per_run": [asdict(r) for r in runs],
    }


def section_text(data: Mapping[str, Any]) -> str:
    """The Markdown section ``docs/bench/sim-costs.md``."""
    lines = [f"## {NAME}", "", f"Command: `{data['command']}`", "",
             f"Measured on {data['machine']}, {data['date']}: {data['runs']} runs, each on a "
             "fresh local cluster (Redis, one CPU node of 2 cores, the bubblewrap sandbox) and "
             "a warm container of the sandbox image on the local Docker engine. Each run's "
             "figure is the median of its samples; the table gives the median over runs and "
             "(min-max) their range. The simulator charges the medians of the figures marked "
             "*charged*, rounded to the millisecond, from `tangram_bench/sim/measured_costs.json`, "
             "which this command writes.", "",
             "| figure | what | median (min-max) over runs | simulator |",
             "| --- | --- | --- | --- |"]
    costs = charged_costs(data)
    for name, what in FIGURES.items():
        use = f"charged: {costs[name]} s" if name in costs else "context"
        lines.append(f"| {name} | {what} | {span(data['figures'][name])} | {use} |")
    lines += ["", "| run | " + " | ".join(FIGURES) + " |",
              "| --- |" + " --- |" * len(FIGURES)]
    for i, raw in enumerate(data["per_run"], 1):
        run = Run(**raw)
        lines.append(f"| {i} | " + " | ".join(ms(figure(run, n)) for n in FIGURES) + " |")
    return "\n".join(lines)
