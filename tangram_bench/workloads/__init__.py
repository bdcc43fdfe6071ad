"""Benchmark workloads: seeded generators (AI coding, MOPD-like, DeepSearch-like) and traces.

``build(name, batch, seed)`` makes a generated workload by name; :mod:`.trace` reads and writes
the JSON Lines trace format so users can replay their own.

May import: the ground floor; the simulator and the benchmarks read these workloads.
"""

from __future__ import annotations

from collections.abc import Callable

from tangram_bench.workloads.coding import CodingParams, coding
from tangram_bench.workloads.deepsearch import deepsearch
from tangram_bench.workloads.model import ActionSpec, ApiLimit, Trajectory, Workload
from tangram_bench.workloads.mopd import MopdParams, mopd
from tangram_bench.workloads.trace import parse_trace, read_trace, write_trace

GENERATORS: dict[str, Callable[[int, int], Workload]] = {
    "coding": lambda batch, seed: coding(batch, seed),
    "mopd": lambda batch, seed: mopd(batch, seed),
    "deepsearch": lambda batch, seed: deepsearch(batch, seed),
}


def build(name: str, batch: int, seed: int) -> Workload:
    """The generated workload ``name`` with ``batch`` trajectories (samples per step)."""
    try:
        generator = GENERATORS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; one of {sorted(GENERATORS)}") from None
    return generator(batch, seed)


__all__ = [
    "GENERATORS",
    "ActionSpec",
    "ApiLimit",
    "CodingParams",
    "MopdParams",
    "Trajectory",
    "Workload",
    "build",
    "coding",
    "deepsearch",
    "mopd",
    "parse_trace",
    "read_trace",
    "write_trace",
]
