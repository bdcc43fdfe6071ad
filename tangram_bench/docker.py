"""Docker sandbox start-up and exec latency, side by side with the embedded (bubblewrap) backend.

    python -m tangram_bench.docker [--n 30] [--docker-url unix:///var/run/docker.sock]
                                          [--image TAG] [--root /var/tmp] [--skip-bwrap]

Every measurement is the wall time of ``run()`` of a trivial ``true`` (default small limits):

- *docker cold start*: a fresh trajectory with the warm pool off: create and start a container,
  pin it, exec (``end_trajectory`` is outside the timing);
- *docker warm-pool hit*: a fresh trajectory that takes a ready container from the pool (the
  pool is refilled outside the timing);
- *docker warm exec*: an action in an existing trajectory's container (pin + exec), the
  actions ``--gap-ms`` apart as between two LLM turns (the container is throttled back in the
  background after each action; back to back, ``--gap-ms 0``, that update is on the path);
- *bwrap cold start* / *bwrap warm action*: the same for the embedded backend.

Needs a running engine holding the sandbox image (``bash scripts/build-sandbox-image.sh``) and
root (for the embedded backend's per-trajectory uids).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tangram_bench.sandbox import bwrap_version, ms, percentile
from tangram_celery.errors import SandboxError
from tangram_celery.sandbox import ExecSpec, SandboxBackend, SandboxLimits
from tangram_celery.sandbox.bwrap import BwrapBackend
from tangram_celery.sandbox.docker import DockerBackend, WarmPoolPolicy
from tangram_celery.sandbox.docker.engine import DEFAULT_DOCKER_URL
from tangram_celery.sandbox.docker.image import DEFAULT_TAG

Row = tuple[str, list[float]]


def timed_run(backend: SandboxBackend, trajectory_id: str, core: int) -> float:
    """Wall time of ``true`` in ``trajectory_id``; raises if it did not succeed."""
    spec = ExecSpec(trajectory_id, "true", {}, 30.0, (core,))
    t0 = time.perf_counter()
    outcome = backend.run(spec)
    elapsed = time.perf_counter() - t0
    if outcome.exit_code != 0:
        raise SystemExit(f"{backend.name} run failed: {outcome.stderr}")
    return elapsed


def fresh_trajectories(
    backend: SandboxBackend, n: int, core: int, prefix: str,
    before: Callable[[], None] = lambda: None,
) -> list[float]:
    """``true`` in ``n`` new trajectories, each ended afterwards; ``before`` runs untimed."""
    times = []
    for i in range(n):
        before()
        times.append(timed_run(backend, f"{prefix}-{i}", core))
        backend.end_trajectory(f"{prefix}-{i}")
    return times


def same_trajectory(
    backend: SandboxBackend, n: int, core: int, name: str, gap_s: float
) -> list[float]:
    """``true`` ``n`` times in one existing trajectory, ``gap_s`` apart (untimed)."""
    timed_run(backend, name, core)
    times = []
    for _ in range(n):
        time.sleep(gap_s)
        times.append(timed_run(backend, name, core))
    backend.end_trajectory(name)
    return times


def wait_for_pool(backend: DockerBackend, size: int, timeout_s: float = 30.0) -> None:
    """Block until the warm pool holds ``size`` ready containers."""
    deadline = time.monotonic() + timeout_s
    while backend.pool_size() < size:
        if time.monotonic() > deadline:
            raise SystemExit("the warm pool did not refill within 30 s")
        time.sleep(0.01)
    time.sleep(0.05)  # let the keeper's create call settle


def docker_rows(
    args: argparse.Namespace, limits: SandboxLimits, root: Path, core: int
) -> list[Row]:
    """Cold start, warm-pool hit and warm exec of the Docker backend."""
    cold_backend = DockerBackend(root / "docker-cold", limits, docker_url=args.docker_url,
                                 image=args.image, warm_pool=WarmPoolPolicy(0, 0))
    try:
        info = cold_backend.client.version()
        print(f"docker sandbox: engine {info.get('Version', '?')} at {args.docker_url}, "
              f"image {args.image}, {len(os.sched_getaffinity(0))} cores, n={args.n}")
        cold = fresh_trajectories(cold_backend, args.n, core, "cold")
        warm = same_trajectory(cold_backend, args.n, core, "warm", args.gap_ms / 1000)
    finally:
        cold_backend.close()
    pooled_backend = DockerBackend(root / "docker-pool", limits, docker_url=args.docker_url,
                                   image=args.image, warm_pool=WarmPoolPolicy(1, 1), tick_s=0.01)
    try:
        hits = fresh_trajectories(pooled_backend, args.n, core, "hit",
                                  before=lambda: wait_for_pool(pooled_backend, 1))
    finally:
        pooled_backend.close()
    return [("docker cold start (new container)", cold),
            ("docker warm-pool hit (ready container)", hits),
            ("docker warm exec (existing container)", warm)]


def bwrap_rows(
    args: argparse.Namespace, limits: SandboxLimits, root: Path, core: int
) -> list[Row]:
    """Cold start and warm action of the embedded backend."""
    backend = BwrapBackend(root / "bwrap", limits)
    try:
        controllers = ",".join(backend.cgroups.controllers) if backend.cgroups else "off"
        print(f"embedded sandbox: {bwrap_version()}, cgroups: {controllers or 'none writable'}, "
              f"seccomp: on")
        cold = fresh_trajectories(backend, args.n, core, "cold")
        warm = same_trajectory(backend, args.n, core, "warm", args.gap_ms / 1000)
    finally:
        backend.close()
    return [("bwrap cold start (fresh trajectory)", cold),
            ("bwrap warm action (existing trajectory)", warm)]


def ratio(rows: dict[str, list[float]], top: str, bottom: str) -> str:
    """``top / bottom`` of the p50s as ``12.3x`` (``n/a`` when either is missing)."""
    if top not in rows or bottom not in rows:
        return "n/a"
    return f"{percentile(rows[top], 0.5) / percentile(rows[bottom], 0.5):.1f}x"


def print_table(rows: Sequence[Row]) -> None:
    """The measurements side by side, then the ratios of their medians."""
    width = max(len(name) for name, _ in rows)
    print(f"{'':{width}}  {'p50':>9}  {'p90':>9}  {'mean':>9}")
    for name, values in rows:
        print(f"{name:{width}}  {ms(percentile(values, 0.5)):>9}  {ms(percentile(values, 0.9)):>9}"
              f"  {ms(statistics.fmean(values)):>9}")
    by_name = {name.split(" (")[0]: values for name, values in rows}
    pairs = [("docker cold start", "docker warm-pool hit"),
             ("docker warm-pool hit", "docker warm exec"),
             ("docker cold start", "bwrap cold start"),
             ("docker warm-pool hit", "bwrap cold start"),
             ("docker warm exec", "bwrap warm action")]
    print("ratios of p50: " + "; ".join(f"{a} / {b} = {ratio(by_name, a, b)}" for a, b in pairs))


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description="Docker vs embedded sandbox start-up latency.")
    parser.add_argument("--n", type=int, default=30, help="runs per measurement")
    parser.add_argument("--docker-url", default=DEFAULT_DOCKER_URL, help="the engine's address")
    parser.add_argument("--image", default=DEFAULT_TAG, help="sandbox image tag")
    parser.add_argument("--root", type=Path, default=Path("/var/tmp"),  # nosec B108 # world-traversable parent for sandbox roots; --root overrides
                        help="world-traversable parent for the temporary sandbox roots")
    parser.add_argument("--gap-ms", type=float, default=100.0,
                        help="untimed pause between warm actions (the LLM's turn)")
    parser.add_argument("--skip-bwrap", action="store_true", help="measure Docker only")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="tangram-bench-", dir=args.root))
    root.chmod(0o755)
    core = min(os.sched_getaffinity(0))
    limits = SandboxLimits()
    try:
        rows = docker_rows(args, limits, root, core)
        if not args.skip_bwrap:
            rows += bwrap_rows(args, limits, root, core)
    except SandboxError as exc:
        raise SystemExit(str(exc)) from exc
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_table(rows)


if __name__ == "__main__":
    main()
