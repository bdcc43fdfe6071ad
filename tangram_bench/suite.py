"""``tangram bench``: the paper's experiments as one command, simulated or on the real stack.

    tangram bench coding --mode sim --sweep batch --out docs
    tangram bench mopd --mode sim --sweep gpus --systems tangram,static,fixed-dop-4,celery
    tangram bench coding --mode real --systems tangram,fixed-dop-4,celery --batch 8 --cores 8
    tangram bench mopd --mode real [--batch 48] [--gpus 24] [--time-scale 1] [--think-scale 0.1]
    tangram bench trace --trace mine.jsonl --mode sim
    tangram bench robustness [--scale 4] [--ablations]   (see bench.robustness)
    tangram bench gateway [--clients 1,8,32]   (verl-style load; see bench.gateway)
    tangram bench mopd-parity [--seeds 1,2,3]   (GPUs for equal ACT, see bench.mopd_parity)
    tangram bench costs [--repeat 5] --out docs   (the sim's measured costs, see bench.costs_bench)
    tangram bench malleable [--repeat 3] --out docs   (real suites, malleable runs: bench.malleable)

Workloads: ``coding``, ``mopd``, ``deepsearch`` (seeded generators) or ``trace`` (a JSON Lines
file, see :mod:`tangram_bench.workloads.trace`). Systems: see
:mod:`tangram_bench.sim.systems`. Each invocation writes, under ``--out``:

* ``bench/<name>.actions.json``: every action's ACT parts, per run;
* ``bench/<name>.json``: the summaries; ``bench/<name>.md``: the report section;
* ``bench/<name>-cdf.png``, ``-breakdown.png`` and, for sweeps, ``-sweep.png``;
* ``results.md``: every section under ``--out/bench``, rebuilt (never edit it by hand).

``<name>`` is ``<workload>-<mode>[-<sweep>][-<tag>]``. The real mode also simulates the same
workload on the same single node (preset ``sim``), so the two orderings compare like with like.
The real mode runs ``coding`` (one CPU node worker, :mod:`tangram_bench.elastic`) and
``mopd`` (GPU pool workers on a real tritonserver with emulated teachers, at ``--time-scale``,
:mod:`tangram_bench.mopd_real`; simulated beside it on the same GPUs at the same scale).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from tangram_bench import runs
from tangram_bench.malleable_flags import add_knob_arguments
from tangram_bench.outputs import write
from tangram_bench.plan import SWEEPS
from tangram_bench.resolve import REAL_GPU_SYSTEMS, REAL_SYSTEMS, resolve
from tangram_bench.sim.durations import DEFAULT_DURATIONS
from tangram_bench.sim.invariants import violations
from tangram_bench.sim.policy import DEFAULT_POLICY
from tangram_bench.sim.systems import DEFAULT_SYSTEMS
from tangram_bench.workloads import GENERATORS


def build_parser() -> argparse.ArgumentParser:
    """The arguments of ``tangram bench``."""
    parser = argparse.ArgumentParser(prog="tangram bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", choices=[*sorted(GENERATORS), "trace"])
    parser.add_argument("--systems", default=None,
                        help="comma-separated systems (sim default: "
                             f"{','.join(DEFAULT_SYSTEMS)}; real: {','.join(REAL_SYSTEMS)}; "
                             f"mopd real: {','.join(REAL_GPU_SYSTEMS)})")
    parser.add_argument("--mode", choices=("sim", "real"), default="sim")
    parser.add_argument("--sweep", choices=sorted(SWEEPS), default=None)
    parser.add_argument("--points", default=None, help="comma-separated sweep values")
    parser.add_argument("--batch", type=int, default=None,
                        help="trajectories (samples per step for mopd); sim 1280, real 8 "
                             "(mopd real 48)")
    parser.add_argument("--cores", type=int, default=None,
                        help="CPU cores: sim 1280 (multiple of 256), real: one node's cores (8)")
    parser.add_argument("--gpus", type=int, default=None,
                        help="GPUs (multiple of 8): 40, mopd real 24 (static needs 20 to host "
                             "one replica of each of the 8 teachers)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seeds", default=None,
                        help="sim: comma-separated seeds, e.g. 1,2,3; every table gives the mean "
                             "and (range) over them (default: --seed alone)")
    parser.add_argument("--costs", default="sched,cp",
                        help="cost presets: sched (scheduling alone), cp (control plane), or "
                             "one control-plane cost alone: pods110, pods256, podstart, exec, "
                             "api, dispatch (see sim.costs)")
    parser.add_argument("--policy", default=DEFAULT_POLICY, help="tangram's default policy")
    parser.add_argument("--durations", default=DEFAULT_DURATIONS,
                        help="what the policies (CPU nodes and the GPU pool) are told of "
                             "durations: learned online from every pool (default), "
                             "learned:node (each pool alone), oracle (exact: an ablation) or "
                             "noisy:SIGMA (exact times a log-normal error); mopd real: "
                             "learned (calls go without t1 and p) or oracle")
    parser.add_argument("--group", type=int, default=None,
                        help="sim coding: GRPO group size G, rollouts per prompt sharing one "
                             "test suite (default 8, TRL's num_generations)")
    parser.add_argument("--trace", type=Path, default=None, help="JSON Lines trace to replay")
    add_knob_arguments(parser)
    parser.add_argument("--load-init-s", type=float, default=None,
                        help="GPU service restore: fixed seconds (default 2.0)")
    parser.add_argument("--restore-gbps", type=float, default=None,
                        help="GPU service restore: GB/s per GPU (default 10)")
    parser.add_argument("--time-scale", type=float, default=None,
                        help="mopd real: every duration (think, teacher call, restore) times "
                             "this (default 1)")
    parser.add_argument("--think-scale", type=float, default=None,
                        help="mopd real: the LLM's generation (think) times also times this "
                             "(default 0.1)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--tag", default="", help="suffix of the output names (variants)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and write its outputs; returns a process exit code."""
    given = sys.argv[1:] if argv is None else list(argv)
    if given[:1] == ["robustness"]:
        from tangram_bench.robustness import main as robustness_main

        return robustness_main(given[1:])
    if given[:1] == ["gateway"]:
        from tangram_bench.gateway import main as gateway_main

        return gateway_main(given[1:])

    if given[:1] == ["mopd-parity"]:
        from tangram_bench.mopd_parity import main as parity_main

        return parity_main(given[1:])
    args = build_parser().parse_args(given)
    command = "tangram bench " + " ".join(given)
    try:
        plan = resolve(args)
    except ValueError as exc:
        print(f"tangram bench: error: {exc}", file=sys.stderr)
        return 2
    runner = runs.runner(args)
    results, summaries = runs.run_all(plan, runner)
    if not results:
        print("tangram bench: error: no system could run at these points (each skip is "
              "printed above); nothing was written", file=sys.stderr)
        return 2
    if args.mode == "real" and args.workload == "mopd":
        plan, results, summaries = runs.with_measured(args, plan, results)
    by_point = {str(p.as_dict()): p for p in plan.points}
    failures = [(r.system, problem) for r in results
                for problem in violations(plan.workload(by_point[str(r.point)], r.seed), r)][:10]
    write(args, command, plan, results, summaries)
    for name, problem in failures:
        print(f"invariant violated ({name}): {problem}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
