"""The resize costs of simulated malleable test runs as command-line flags (``--grow-cost``,
``--takeback``, ``--reserve``), shared by ``tangram bench`` and ``tangram bench robustness``."""

from __future__ import annotations

import argparse
from dataclasses import replace

from tangram_bench.sim.malleable import MalleableKnobs


def add_knob_arguments(parser: argparse.ArgumentParser) -> None:
    """The resize costs of simulated malleable runs, as flags."""
    defaults = MalleableKnobs()
    parser.add_argument("--grow-cost", type=float, default=defaults.worker_start_s,
                        help="seconds a core that joins a malleable test run holds before it "
                             "works (worker start and collection)")
    parser.add_argument("--takeback", type=float, default=defaults.takeback_s,
                        help="seconds before a core taken back from a malleable run is free")
    parser.add_argument("--reserve", type=float, default=defaults.reserve_s,
                        help="keep free the cores that many seconds of the actions that are "
                             "not test runs take to arrive (0: none)")


def knobs(args: argparse.Namespace) -> MalleableKnobs:
    """The resize costs the flags give."""
    return replace(MalleableKnobs(), worker_start_s=args.grow_cost, takeback_s=args.takeback,
                   reserve_s=args.reserve)
