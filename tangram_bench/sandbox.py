"""Embedded-sandbox start-up cost: cold start in a fresh trajectory, warm action in an old one.

    python -m tangram_bench.sandbox [--n 100] [--root /var/tmp] [--no-cgroups]

*Cold start* times ``run()`` of a trivial ``true`` in a trajectory that does not exist yet (work
dir creation, uid, cgroups, bubblewrap, namespaces; ``end_trajectory`` is outside the timing).
*Warm action* times ``run()`` of ``true`` in an existing trajectory, and reports the backend's
own ``setup_s``/``exec_s`` split. *Recycled sandbox* times taking a wiped sandbox for a
one-request trajectory (``lease``) and a ``true`` in it. Run it as root, as the CPU worker runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from tangram_celery.sandbox import ExecSpec, SandboxLimits
from tangram_celery.sandbox.bwrap import BwrapBackend


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest-rank."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def ms(value: float) -> str:
    """Seconds as ``12.3 ms``."""
    return f"{value * 1000:.1f} ms"


def cold_starts(backend: BwrapBackend, n: int, core: int) -> list[float]:
    """Wall time of ``true`` in ``n`` fresh trajectories."""
    times = []
    for i in range(n):
        spec = ExecSpec(f"bench-cold-{i}", "true", {}, 30.0, (core,))
        t0 = time.perf_counter()
        outcome = backend.run(spec)
        times.append(time.perf_counter() - t0)
        backend.end_trajectory(spec.trajectory_id)
        if outcome.exit_code != 0:
            raise SystemExit(f"sandbox run failed: {outcome.stderr}")
    return times


def warm_actions(backend: BwrapBackend, n: int, core: int) -> tuple[list[float], ...]:
    """Wall, setup and exec times of ``true`` run ``n`` times in one existing trajectory."""
    spec = ExecSpec("bench-warm", "true", {}, 30.0, (core,))
    backend.run(spec)
    wall, setup, exec_ = [], [], []
    for _ in range(n):
        t0 = time.perf_counter()
        outcome = backend.run(spec)
        wall.append(time.perf_counter() - t0)
        setup.append(outcome.setup_s)
        exec_.append(outcome.exec_s)
    backend.end_trajectory(spec.trajectory_id)
    return wall, setup, exec_


def recycled(backend: BwrapBackend, n: int, core: int) -> tuple[list[float], list[float]]:
    """Time to take a recycled sandbox (entering :meth:`BwrapBackend.lease` with one idle), and
    the wall time of a one-request ``true`` in it; ``n`` of each."""
    take, wall = [], []
    for i in range(n):
        deadline = time.monotonic() + 10
        while backend.recycled.idle() == 0 and i and time.monotonic() < deadline:
            time.sleep(0.001)
        tid = f"bench-recycled-{i}"
        t0 = time.perf_counter()
        with backend.lease(tid):
            t1 = time.perf_counter()
            backend.run(ExecSpec(tid, "true", {}, 30.0, (core,)))
            t2 = time.perf_counter()
        if i:
            take.append(t1 - t0)
            wall.append(t2 - t0)
    return take, wall


def bwrap_version() -> str:
    """``bubblewrap x.y.z`` or ``?``."""
    try:
        done = subprocess.run(["bwrap", "--version"], capture_output=True, text=True, timeout=10)  # nosec B607 # `bwrap --version` from PATH, as the backend itself runs it
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return done.stdout.strip() or "?"


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description="Embedded-sandbox cold start and warm action.")
    parser.add_argument("--n", type=int, default=100, help="runs per measurement")
    parser.add_argument("--root", type=Path, default=Path("/var/tmp"),  # nosec B108 # world-traversable parent for sandbox roots; --root overrides
                        help="world-traversable parent for the temporary sandbox root")
    parser.add_argument("--no-cgroups", action="store_true", help="rlimits only")
    parser.add_argument("--no-seccomp", action="store_true", help="no seccomp filter")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="tangram-bench-", dir=args.root))
    root.chmod(0o755)
    core = min(os.sched_getaffinity(0))
    degraded = args.no_cgroups or args.no_seccomp
    backend = BwrapBackend(root, SandboxLimits(), cgroups=not args.no_cgroups,
                           seccomp=not args.no_seccomp,
                           enforce="best-effort" if degraded else "strict")
    try:
        controllers = ",".join(backend.cgroups.controllers) if backend.cgroups else "off"
        print(f"embedded sandbox: {bwrap_version()}, uid {os.geteuid()} -> per-trajectory uids, "
              f"cgroups: {controllers or 'none writable'}, "
              f"seccomp: {'off' if args.no_seccomp else 'on'}, "
              f"{len(os.sched_getaffinity(0))} cores, n={args.n}")
        cold = cold_starts(backend, args.n, core)
        wall, setup, exec_ = warm_actions(backend, args.n, core)
        take, one = recycled(backend, args.n, core)
    finally:
        backend.close()
        shutil.rmtree(root, ignore_errors=True)
    print(f"cold start (fresh trajectory, `true`): p50 {ms(percentile(cold, 0.5))}  "
          f"p90 {ms(percentile(cold, 0.9))}  mean {ms(statistics.fmean(cold))}")
    print(f"warm action (existing trajectory, `true`): p50 {ms(percentile(wall, 0.5))}  "
          f"p90 {ms(percentile(wall, 0.9))}  "
          f"(setup_s p50 {ms(percentile(setup, 0.5))}, exec_s p50 {ms(percentile(exec_, 0.5))})")
    print(f"recycled sandbox: take p50 {percentile(take, 0.5) * 1e3:.3f} ms  p90 "
          f"{percentile(take, 0.9) * 1e3:.3f} ms; one-request `true` (take, run) p50 "
          f"{ms(percentile(one, 0.5))}  p90 {ms(percentile(one, 0.9))}")


if __name__ == "__main__":
    main()
