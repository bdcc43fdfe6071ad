"""MOPD on GPUs, over several seeds: the GPUs tangram needs for the mean ACT of each static
baseline, and every pooled baseline with and without cache awareness.

    tangram bench mopd-parity [--seeds 1,2,3] [--batch 512] [--gpus 8,16,24,32,40]
                              [--durations learned|oracle|noisy:S]
                              [--load-init-s S --restore-gbps R --tag T] [--out docs]

The pooled systems' GPU policies learn each teacher's service time per DoP from the calls they
served (``--durations learned``, the default); ``oracle`` tells them every call's exact time
(an ablation), ``noisy:S`` the exact time with a log-normal error.

Per seed (the same seeded MOPD workload for every system, control-plane costs charged):

* tangram on every GPU count of ``--gpus``;
* the two static baselines: ``static`` (replicas sized by an oracle of the whole run's demand,
  on the most GPUs swept) and the paper's ``static-tp4`` (one TP4 replica per teacher, on the
  GPUs that takes);
* the pooled baselines on the most GPUs swept: fixed DoP and plain Celery through the paper's
  allocator, cache-oblivious as the paper runs them and cache-aware (``:cache``, see
  :mod:`tangram_bench.sim.systems`).

*GPUs for equal mean ACT*: the fewest GPUs on which tangram's mean ACT is at most the
baseline's, as a share of the baseline's GPUs, read two ways: the smallest swept count, and
the count interpolated linearly between the two swept counts around it. Every figure is the
mean over the seeds with the range (min-max) beside it. Writes ``bench/mopd-sim-parity[-tag]``
``.md`` and ``.json`` under ``--out``, rebuilds ``results.md`` and the README's results block.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from tangram_bench.mopd_tables import Run, parity_section
from tangram_bench.report import publish
from tangram_bench.sim.cluster import Cluster
from tangram_bench.sim.costs import PRESETS
from tangram_bench.sim.durations import DEFAULT_DURATIONS, ablation, parse_durations
from tangram_bench.sim.services import tp_layout
from tangram_bench.sim.systems import simulate
from tangram_bench.workloads import mopd

PAPER = "static-tp4"
ORACLE = "static"
POOLED = ("fixed-dop-4", "fixed-dop-4:cache", "fixed-dop-8", "fixed-dop-8:cache", "celery",
          "celery:cache")
COSTS = "cp"


@dataclass(frozen=True)
class Task:
    """One simulated run: a system on one seed's workload and cluster."""

    system: str
    seed: int
    gpus: int
    batch: int
    load_init_s: float
    restore_gbps: float
    durations: str = DEFAULT_DURATIONS


def run_one(task: Task) -> Run:
    """Simulate one task; its mean ACT, restores, GPUs held and step time."""
    workload = mopd(task.batch, task.seed)
    cluster = Cluster(gpu_nodes=task.gpus // 8, load_init_s=task.load_init_s,
                      restore_gbps=task.restore_gbps)
    result = simulate(workload, task.system, cluster, PRESETS[COSTS], seed=task.seed,
                      durations=parse_durations(task.durations))
    acts = [r.total for r in result.records]
    return Run(task.system, task.seed, int(result.capacity.get("gpu", task.gpus)),
               statistics.fmean(acts), sum(r.loaded for r in result.records),
               statistics.fmean(result.step_times) if result.step_times else result.makespan,
               result.wall_s)


def tasks(args: argparse.Namespace) -> list[Task]:
    """Every run of the benchmark, in a fixed order."""
    top = max(args.gpus)
    paper_gpus = -(-sum(tp_layout(mopd(8, 1), 4)[1].values()) // 8) * 8
    made = []
    for seed in args.seeds:
        def task(system: str, gpus: int, seed: int = seed) -> Task:
            return Task(system, seed, gpus, args.batch, args.load_init_s, args.restore_gbps,
                        args.durations)

        made += [task("tangram", gpus) for gpus in args.gpus]
        made += [task(ORACLE, top), task(PAPER, paper_gpus)]
        made += [task(system, top) for system in args.pooled]
    return made


def _ints(text: str) -> tuple[int, ...]:
    values = tuple(int(v) for v in text.split(",") if v.strip())
    if not values:
        raise argparse.ArgumentTypeError("give comma-separated integers")
    return values


def _gpu_counts(text: str) -> tuple[int, ...]:
    values = tuple(sorted(_ints(text)))
    if any(v < 8 or v % 8 for v in values):
        raise argparse.ArgumentTypeError("GPU counts are multiples of 8 (nodes of 8 GPUs)")
    return values


def build_parser() -> argparse.ArgumentParser:
    """The arguments of ``tangram bench mopd-parity``."""
    parser = argparse.ArgumentParser(prog="tangram bench mopd-parity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=_ints, default=(1, 2, 3))
    parser.add_argument("--batch", type=int, default=512, help="samples per step")
    parser.add_argument("--gpus", type=_gpu_counts, default=(8, 16, 24, 32, 40),
                        help="tangram's GPU counts; the most is the oracle's and the pooled "
                             "baselines'")
    parser.add_argument("--pooled", type=lambda t: tuple(t.split(",")), default=POOLED)
    parser.add_argument("--load-init-s", type=float, default=Cluster.load_init_s)
    parser.add_argument("--restore-gbps", type=float, default=Cluster.restore_gbps)
    parser.add_argument("--durations", type=_durations, default=DEFAULT_DURATIONS,
                        help="what the pooled GPU policies are told of durations: learned "
                             "online per teacher and DoP (default), learned:node, oracle "
                             "(exact: an ablation) or noisy:SIGMA")
    parser.add_argument("--jobs", type=int, default=1, help="simulations run in parallel")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--tag", default="", help="suffix of the output names (variants)")
    return parser


def _durations(text: str) -> str:
    try:
        return parse_durations(text).label
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def main(argv: Sequence[str] | None = None) -> int:
    """Run every simulation, print and write the section; a process exit code."""
    given = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(given)
    if args.batch < 1 or args.jobs < 1:
        print("tangram bench mopd-parity: error: --batch and --jobs must be >= 1",
              file=sys.stderr)
        return 2
    todo = tasks(args)
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            runs = list(pool.map(run_one, todo))
    else:
        runs = [run_one(task) for task in todo]
    name = "-".join(p for p in ("mopd-sim-parity", args.tag) if p)
    command = "tangram bench mopd-parity " + " ".join(given)
    setup = (f"Simulated MOPD (`mopd` workload, batch {args.batch} samples per step, 4 steps), "
             f"seeds {', '.join(map(str, args.seeds))}, GPU nodes of 8 x 80 GB, restore "
             f"{args.load_init_s} s + weights at {args.restore_gbps} GB/s per GPU, "
             f"control-plane costs charged; durations told to the policies: "
             f"`{args.durations}`{ablation(args.durations)}; "
             f"{len(runs)} runs in "
             f"{sum(r.wall_s for r in runs):.0f} s of simulation wall time on this machine.")
    text = parity_section(name, command, setup, runs, max(args.gpus), PAPER, ORACLE,
                          args.pooled)
    folder = args.out / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps([asdict(r) for r in runs], indent=1))
    publish(args.out, name, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
