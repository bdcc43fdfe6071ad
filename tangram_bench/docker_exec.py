"""Container exec latency through the Docker SDK: the per-action cost a pod-per-trajectory
baseline pays, measured on our own stack.

    python -m tangram_bench.docker_exec --image IMAGE [--host unix:///...] [--n 50]

It starts one warm container (no network, as a sandbox would run), times ``exec_run(["true"])``
``n`` times, times ``n // 5`` cold ``containers.run(..., remove=True)`` starts, removes what it
started and prints the medians and p90s as JSON. The simulator's ``exec_latency_s`` default
was first measured this way; ``tangram bench costs`` (:mod:`tangram_bench.costs_bench`) now
measures it over several runs and writes what :mod:`tangram_bench.sim.costs` charges.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import docker


def timed(action: Callable[[], object], n: int) -> list[float]:
    """Wall times of ``n`` calls of ``action``, in seconds."""
    times = []
    for _ in range(n):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return times


def quantiles(values: Sequence[float]) -> dict[str, float]:
    """p50 and p90 in milliseconds."""
    ordered = sorted(values)
    return {"p50_ms": round(statistics.median(ordered) * 1000, 2),
            "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))] * 1000, 2)}


def exec_and_start_times(client: Any, image: str, n: int,
                         starts: int) -> tuple[list[float], list[float]]:
    """``n`` ``exec_run(["true"])`` times in one warm container of ``image``, then ``starts``
    ``containers.run(..., remove=True)`` times, in seconds."""
    name = f"tangram-bench-exec-{uuid.uuid4().hex[:8]}"
    container = client.containers.run(image, ["sleep", "600"], name=name, detach=True,
                                      network_mode="none", remove=True)
    try:
        container.exec_run(["true"])
        execs = timed(lambda: container.exec_run(["true"]), n)
    finally:
        container.kill()
    return execs, timed(lambda: client.containers.run(image, ["true"], network_mode="none",
                                                      remove=True), starts)


def measure(client: Any, image: str, n: int) -> dict[str, Any]:
    """Exec and cold-start latencies against ``client`` with ``image``."""
    execs, starts = exec_and_start_times(client, image, n, max(n // 5, 1))
    return {"image": image, "n": n, "exec_run": quantiles(execs),
            "run_remove": quantiles(starts)}


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print the latencies as JSON."""
    parser = argparse.ArgumentParser(prog="python -m tangram_bench.docker_exec")
    parser.add_argument("--image", required=True, help="a local image with `true` and `sleep`")
    parser.add_argument("--host", default=None, help="Docker host URL (default: environment)")
    parser.add_argument("--n", type=int, default=50)
    args = parser.parse_args(argv)
    client = docker.DockerClient(base_url=args.host) if args.host else docker.from_env()
    print(json.dumps(measure(client, args.image, args.n), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
