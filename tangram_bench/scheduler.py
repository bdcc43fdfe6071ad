"""Benchmark of the elastic scheduler: ``python -m tangram_bench.scheduler [--json]``.

(a) Decision time of `decide` for 256 candidates on 256 free cores (4 NUMA groups), allowed
    unit counts 1..32, depth 2: the median over repeated calls. "warm" reuses the same `Job`
    objects (as a node worker does for jobs still queued, whose option arrays are cached);
    "cold" builds fresh ones before every call. Durations follow Amdahl's law,
    T1 / (E(m) m) = T1 (f + (1 - f) / m), with T1 and the serial fraction f drawn per job.
    The same for the robust scheduler (`decide_robust`, tangram's default), with the forecast
    its queue implies: elastic jobs arriving at 256 / 5 s, no short load (its DoP cap binds).
(b) Speed-up over the naive version (`scheduling.reference`: a plain-Python DP recomputed at
    every eviction step, the paper's formulation) at n = m = 64, checking that both return
    the same decision. A GPU row does the same on 64 GPUs with allowed sets {1, 2, 4, 8}.
(c) Decision time of the service-aware GPU scheduler (`decide_replicas`, tangram's default on
    GPU pools) beside the paper's allocator on 40 GPUs, 256 jobs of 8 services, half the GPUs
    busy, residents on the first node.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from tangram_celery.scheduling import (
    Core,
    CpuPool,
    Decision,
    Demand,
    GpuPool,
    Job,
    Outlook,
    RunningJob,
    Snapshot,
    decide,
    decide_robust,
)
from tangram_celery.scheduling.demand import time_curve
from tangram_celery.scheduling.reference import decide_reference
from tangram_celery.scheduling.replicas import decide_replicas
from tangram_celery.scheduling.residency import Resident, service_name
from tangram_celery.scheduling.types import Service

Sampler = Callable[[random.Random], tuple[float, float]]
"""Draws (T1, serial fraction) for one job."""

WORKLOADS: dict[str, Sampler] = {
    "uniform T1 0.5-2 s, f 0.05-0.5": lambda r: (r.uniform(0.5, 2.0), r.uniform(0.05, 0.5)),
    "lognormal T1 (sigma 1), f 0-0.3": lambda r: (r.lognormvariate(0.0, 1.0), r.uniform(0, 0.3)),
}


@dataclass(frozen=True)
class Row:
    """One line of the result table."""

    case: str
    n: int
    m: int
    s: int
    steps: int
    fast_ms: float
    fast_p90_ms: float
    fast_cpu_ms: float
    naive_ms: float | None = None
    speedup: float | None = None
    identical: bool | None = None


def jobs(n: int, allowed: Sequence[int], sampler: Sampler, seed: int, key: str) -> list[Job]:
    """n waiting jobs with Amdahl durations over `allowed`, submitted over the last 5 s."""
    rng = random.Random(seed)
    result = []
    for i in range(n):
        t1, serial = sampler(rng)
        options = tuple((u, t1 * (serial + (1 - serial) / u)) for u in allowed)
        result.append(Job(f"j{i}", key, options, submitted_at=-5.0 + 5.0 * i / n))
    return result


def cpu_snapshot(waiting: Sequence[Job], cores: int, groups: int = 4) -> Snapshot:
    """`waiting` on an idle node of `cores` cores in `groups` NUMA groups, at t = 0."""
    size = max(1, cores // groups)
    pool = CpuPool("cpu", tuple(Core(i, i // size) for i in range(cores)), cores)
    return Snapshot(0.0, tuple(waiting), (pool,))


def timed(call: Callable[[], object], repeats: int) -> tuple[list[float], list[float]]:
    """Wall-clock and process CPU seconds of each of `repeats` calls."""
    wall, cpu = [], []
    for _ in range(repeats):
        start, used = time.perf_counter(), time.process_time()
        call()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - used)
    return wall, cpu


def p90(values: Sequence[float]) -> float:
    """The 90th percentile."""
    return float(np.percentile(values, 90))


Decider = Callable[[Snapshot], Decision]


def decision_rows(repeats: int) -> list[Row]:
    """(a): 256 candidates, 256 cores, allowed 1..32, depth 2; warm and cold; both policies."""
    rows = []
    for name, sampler in WORKLOADS.items():
        waiting = jobs(256, range(1, 33), sampler, seed=7, key="cpu")
        outlook = busy_outlook(waiting, 256)
        deciders: dict[str, Decider] = {
            "decide": decide,
            "decide_robust": lambda s, o=outlook: decide_robust(s, o),  # type: ignore[misc]
        }
        for policy, decider in deciders.items():
            rows += policy_rows(f"{policy}, {name}", decider, waiting, repeats)
    return rows


def busy_outlook(waiting: Sequence[Job], cores: int) -> Outlook:
    """The forecast of a pool where `waiting` arrived over the last 5 s."""
    curves = np.mean([time_curve(job, cores) for job in waiting], axis=0)
    return Outlook({"cpu": Demand(len(waiting) / 5.0, tuple(curves.tolist()))})


def policy_rows(case: str, decider: Decider, waiting: Sequence[Job], repeats: int) -> list[Row]:
    """Warm (the same jobs every call) and cold (fresh jobs every call) rows of one policy."""
    snapshot = cpu_snapshot(waiting, 256)
    first = decider(snapshot)
    steps = len(first.groups[0].objectives) if first.groups else 0
    warm = timed(lambda: decider(snapshot), repeats)
    cold: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        fresh = cpu_snapshot(
            [Job(j.job_id, j.key, j.options, j.submitted_at) for j in waiting], 256
        )
        wall, cpu = timed(lambda s=fresh: decider(s), 1)  # type: ignore[misc]
        cold[0].extend(wall)
        cold[1].extend(cpu)
    return [
        Row(f"{case}, {label}", 256, 256, 32, steps, statistics.median(wall) * 1e3,
            p90(wall) * 1e3, statistics.median(cpu) * 1e3)
        for label, (wall, cpu) in (("warm", warm), ("cold", cold))
    ]


def speedup_row(case: str, snapshot: Snapshot, s: int, repeats: int, naive_repeats: int) -> Row:
    """(b): `decide` against the naive reference on one snapshot."""
    fast = decide(snapshot)
    naive_decision = decide_reference(snapshot)
    fast_times: list[float] = []
    fast_cpu: list[float] = []
    naive_times: list[float] = []
    for _ in range(naive_repeats):  # interleaved, so both see the same machine load
        naive_times += timed(lambda: decide_reference(snapshot), 1)[0]
        wall, cpu = timed(lambda: decide(snapshot), max(1, repeats // naive_repeats))
        fast_times += wall
        fast_cpu += cpu
    fast_ms = statistics.median(fast_times) * 1e3
    naive_ms = statistics.median(naive_times) * 1e3
    group = fast.groups[0] if fast.groups else None
    pool = snapshot.pools[0]
    m = len(pool.free)
    return Row(
        case,
        len(snapshot.waiting),
        m,
        s,
        len(group.objectives) if group else 0,
        fast_ms,
        p90(fast_times) * 1e3,
        statistics.median(fast_cpu) * 1e3,
        naive_ms,
        naive_ms / fast_ms,
        fast == naive_decision,
    )


def comparison_rows(repeats: int, naive_repeats: int) -> list[Row]:
    """(b) on CPU (n = m = 64, allowed 1..32) and on GPU (64 GPUs, allowed {1, 2, 4, 8})."""
    rows = []
    for name, sampler in WORKLOADS.items():
        snapshot = cpu_snapshot(jobs(64, range(1, 33), sampler, seed=11, key="cpu"), 64)
        rows.append(speedup_row(f"vs naive, CPU, {name}", snapshot, 32, repeats, naive_repeats))
    gpu_jobs = jobs(64, (1, 2, 4, 8), WORKLOADS["uniform T1 0.5-2 s, f 0.05-0.5"], 13, "gpu")
    gpus = Snapshot(0.0, tuple(gpu_jobs), (GpuPool("gpu", tuple(range(64)), 64),))
    rows.append(speedup_row("vs naive, GPU 8x8, uniform T1", gpus, 4, repeats, naive_repeats))
    return rows


SERVICES = 8
"""GPU services of the GPU decision-time case."""


def gpu_snapshot(n: int, gpus: int, seed: int) -> Snapshot:
    """`n` jobs of `SERVICES` services (allowed {1, 2, 4, 8}) on `gpus` GPUs in nodes of 8,
    half of them busy with running jobs, a resident replica of each service at every size on
    the first node's chunks, memory and restore times per service (the service-aware
    scheduler's inputs; the paper's allocator ignores the residency)."""
    rng = random.Random(seed)
    waiting = [
        Job(j.job_id, j.key, j.options, j.submitted_at, service=f"s{i % SERVICES}")
        for i, j in enumerate(jobs(n, (1, 2, 4, 8), WORKLOADS["uniform T1 0.5-2 s, f 0.05-0.5"],
                                    seed, "gpu"))
    ]
    busy = sorted(rng.sample(range(gpus), gpus // 2))
    running = tuple(RunningJob(f"r{g}", "gpu", 1, rng.uniform(0.1, 3.0), (g,), f"s{g % SERVICES}")
                    for g in busy)
    residents = tuple(
        Resident(service_name(f"s{k}", chunk), f"s{k}", chunk, 8000, k)
        for k in range(SERVICES) for chunk in ((k % 8,), tuple(range(k % 4 * 2, k % 4 * 2 + 2)))
    )
    services = tuple(Service(f"s{k}", tuple((d, 8000) for d in (1, 2, 4, 8)),
                             tuple((d, 2.0 + 1.0 / d) for d in (1, 2, 4, 8)))
                     for k in range(SERVICES))
    free = tuple(g for g in range(gpus) if g not in set(busy))
    pool = GpuPool("gpu", free, gpus, 8, residents, services, 80_000)
    return Snapshot(0.0, tuple(waiting), (pool,), running)


def gpu_rows(repeats: int) -> list[Row]:
    """(c): the service-aware GPU scheduler against the paper's allocator on 40 GPUs, 256
    waiting jobs of 8 services, half the GPUs busy (warm: the same jobs every call)."""
    snapshot = gpu_snapshot(256, 40, seed=17)
    rows = []
    for case, decider in (("decide_replicas", decide_replicas), ("decide", decide)):
        wall, cpu = timed(lambda d=decider: d(snapshot), repeats)  # type: ignore[misc]
        rows.append(Row(f"{case}, GPU 40 (5x8), 8 services, half busy", 256, 20, 4, 0,
                        statistics.median(wall) * 1e3, p90(wall) * 1e3,
                        statistics.median(cpu) * 1e3))
    return rows


def render(rows: Sequence[Row]) -> str:
    """The table as text."""
    header = (
        f"{'case':<60} {'n':>4} {'m':>4} {'s':>3} {'steps':>5} {'median':>9} {'p90':>9}"
        f" {'cpu':>9} {'naive':>10} {'speed-up':>9} {'same':>5}"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        naive = f"{row.naive_ms:8.1f}ms" if row.naive_ms is not None else ""
        speed = f"{row.speedup:8.0f}x" if row.speedup is not None else ""
        same = "" if row.identical is None else ("yes" if row.identical else "NO")
        lines.append(
            f"{row.case:<60} {row.n:>4} {row.m:>4} {row.s:>3} {row.steps:>5}"
            f" {row.fast_ms:7.2f}ms {row.fast_p90_ms:7.2f}ms {row.fast_cpu_ms:7.2f}ms"
            f" {naive:>10} {speed:>9} {same:>5}"
        )
    return "\n".join(lines)


GOAL_MS = 2.0
"""The decision-time goal at 256 candidates on 256 cores, warm and cold (median)."""


def verdicts(rows: Sequence[Row]) -> list[str]:
    """One line per warm/cold case of (a): its median against the goal, met or not."""
    lines = []
    for row in rows:
        if row.case.endswith((", warm", ", cold")) and row.n == 256 and row.m == 256:
            state = "met" if row.fast_ms <= GOAL_MS else "NOT met"
            lines.append(f"{row.case}: median {row.fast_ms:.2f} ms (cpu {row.fast_cpu_ms:.2f} "
                         f"ms), goal <= {GOAL_MS:g} ms {state}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the table (or JSON with --json)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--repeats", type=int, default=200, help="calls of decide per case")
    parser.add_argument("--naive-repeats", type=int, default=5, help="calls of the naive one")
    args = parser.parse_args(argv)
    rows = (decision_rows(args.repeats) + comparison_rows(args.repeats, args.naive_repeats)
            + gpu_rows(args.repeats))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    machine = (
        f"python {platform.python_version()}, numpy {np.__version__}, "
        f"{os.cpu_count()} CPUs, {platform.machine()}, load average {load:.1f}"
    )
    if args.json:
        print(json.dumps({"machine": machine, "rows": [asdict(row) for row in rows]}, indent=2))
    else:
        print(f"Elastic scheduler benchmark ({machine}); depth 2")
        print("median, p90: wall clock per decision; cpu: median process CPU time per decision;")
        print("steps: eviction steps evaluated; naive: reference.decide_reference, median wall\n")
        print(render(rows))
        print(
            "\ngoals: decide and decide_robust 256x256x32 median <= 2 ms, warm and cold; "
            "speed-up over naive at n = m = 64 >= 100x"
        )
        print("\n".join(verdicts(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
