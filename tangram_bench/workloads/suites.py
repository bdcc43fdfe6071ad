"""A trace whose test runs are the real suites ``tangram bench malleable`` measured.

    tangram bench malleable --json > suites.json
    python -m tangram_bench.workloads.suites suites.json --batch 64 --out suites.jsonl
    tangram bench trace --trace suites.jsonl --systems ... --grow-cost <printed>

Each trajectory is an AI-coding trajectory (:func:`~.coding.coding_trajectory`: its exec
actions and think times) whose final test run is one of the measured suites, in turn, a GRPO
group of ``group`` trajectories to a suite: its one-core time is the suite's ``plain_1core_s``
and its parallel fraction the one Amdahl's law gives its 2-core speed-up ``S``,
``p = 2 (1 - 1 / S)`` (0 when ``S <= 1``), allowed on 1 to ``max_units`` cores (beyond 2 cores
an extrapolation). The median of the suites' ``worker_start_s`` is printed, to pass to the
simulator as ``--grow-cost``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from tangram_bench.workloads.coding import CodingParams, coding_trajectory
from tangram_bench.workloads.model import ActionSpec, Workload
from tangram_bench.workloads.trace import write_trace

NAME = "suites"


def parallel_of(speedup: float) -> float:
    """Amdahl's parallel fraction of a 2-core speed-up (clipped to [0, 1])."""
    return min(1.0, max(0.0, 2.0 * (1.0 - 1.0 / speedup))) if speedup > 0 else 0.0


def suites_workload(rows: Sequence[Mapping[str, Any]], batch: int, seed: int = 1,
                    group: int = 8, max_units: int = 8) -> Workload:
    """``batch`` coding trajectories whose test runs are the measured suites of ``rows``."""
    usable = [r for r in rows if isinstance(r.get("plain_1core_s"), (int, float))
              and isinstance(r.get("speedup_2core"), (int, float))]
    if not usable or batch < 1 or group < 1 or max_units < 1:
        raise ValueError("give at least one measured suite, and a positive batch, group and "
                         "max_units")
    params = CodingParams(group=group, max_units=max_units)
    trajectories = []
    for index in range(batch):
        base = coding_trajectory(params, seed, index)
        suite = usable[(index // group) % len(usable)]
        test = base.actions[-1]
        parallel = parallel_of(float(suite["speedup_2core"]))
        units = tuple(range(1, max_units + 1)) if parallel > 0 else (1,)
        run = ActionSpec("test_run", float(suite["plain_1core_s"]), test.think_s, units,
                         round(parallel, 4), signature=f"{NAME}-{suite['suite']}")
        trajectories.append(replace(base, actions=(*base.actions[:-1], run)))
    return Workload(NAME, tuple(trajectories))


def grow_cost(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """The median of the suites' measured worker start costs (None when none was)."""
    found = [float(r["worker_start_s"]) for r in rows
             if isinstance(r.get("worker_start_s"), (int, float))]
    return statistics.median(found) if found else None


def main(argv: Sequence[str] | None = None) -> int:
    """Write the trace; print the grow cost to simulate it with."""
    parser = argparse.ArgumentParser(prog="python -m tangram_bench.workloads.suites",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("measured", type=Path, help="`tangram bench malleable --json` output")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-units", type=int, default=8)
    parser.add_argument("--out", type=Path, required=True, help="the trace file to write")
    args = parser.parse_args(argv)
    rows = json.loads(args.measured.read_text())["rows"]
    try:
        workload = suites_workload(rows, args.batch, args.seed, args.group, args.max_units)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write_trace(args.out, workload)
    cost = grow_cost(rows)
    print(f"wrote {args.out}: {args.batch} trajectories over {len(rows)} suites; "
          f"--grow-cost {cost:.3f}" if cost is not None else f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
