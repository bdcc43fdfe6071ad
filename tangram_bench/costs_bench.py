"""The simulator's measured control-plane costs, measured on the real stack over several runs.

    tangram bench costs [--repeat 5] [--n 40] [--image TAG] [--docker-url URL] [--out docs]

Each run starts a fresh local cluster (Redis, one CPU node of 2 cores) and times ``n``
sequential trivial ``true`` actions in one trajectory (tangram's per-action dispatch cost: the
ACT less the exec), then times ``n`` ``exec_run(["true"])`` calls in a warm container of the
sandbox image and ``n // 5`` ``containers.run(..., remove=True)`` starts through the Docker SDK
(:mod:`tangram_bench.docker_exec`). It writes ``OUT/bench/sim-costs.md`` and ``.json``, rebuilds
``OUT/results.md`` and the README block, and writes ``tangram_bench/sim/measured_costs.json``,
from which :mod:`tangram_bench.sim.costs` takes the costs it charges.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import docker
import docker.errors

from tangram_bench.costs_report import NAME, Run, measured, section_text
from tangram_bench.docker_exec import exec_and_start_times
from tangram_bench.overhead import measure_tangram
from tangram_bench.report import publish
from tangram_celery.client import TangramClient
from tangram_celery.sandbox.docker.image import DEFAULT_TAG
from tangram_celery.settings import Settings
from tangram_celery.stack.demo import DemoConfig, local_cluster

SIM_FILE = Path(__file__).resolve().parent / "sim" / "measured_costs.json"
TRAJECTORY = "bench-overhead"
"""The trajectory :func:`~tangram_bench.overhead.measure_tangram` runs its actions in."""


def stack_run(settings: Settings, n: int) -> tuple[float, float]:
    """(ACT, exec) medians in seconds of ``n`` trivial actions on a fresh local cluster."""
    with tempfile.TemporaryDirectory(prefix="tangram-bench-costs-") as logs, \
            local_cluster(settings, DemoConfig(nodes=1, cores_per_node=2), Path(logs)) as live, \
            TangramClient(live) as client:
        try:
            measure_tangram(client, 5)
            results = measure_tangram(client, n)
        finally:
            client.end_trajectory(TRAJECTORY)
    return (statistics.median(r.act["total"] for r in results),
            statistics.median(r.timings.exec_s for r in results))


def docker_run(engine: docker.DockerClient, image: str, n: int) -> tuple[float, float]:
    """(exec_run, run --rm) medians in seconds through the Docker SDK."""
    execs, starts = exec_and_start_times(engine, image, n, max(n // 5, 3))
    return statistics.median(execs), statistics.median(starts)


def engine_of(url: str, image: str) -> docker.DockerClient:
    """A client of the engine at ``url`` that holds ``image``; exits 2 with what to do."""
    try:
        engine = docker.DockerClient(base_url=url, timeout=30)
        engine.ping()
        engine.images.get(image)
    except docker.errors.ImageNotFound:
        raise SystemExit(f"tangram bench costs: the engine at {url} lacks {image}; build it "
                         "with `bash scripts/build-sandbox-image.sh`") from None
    except (docker.errors.DockerException, OSError) as exc:
        raise SystemExit(f"tangram bench costs: no Docker engine answers at {url} ({exc}); "
                         "start one or pass --docker-url") from None
    return engine


def main(argv: Sequence[str] | None = None) -> int:
    """Measure the costs ``--repeat`` times, print the section and write its files."""
    parser = argparse.ArgumentParser(prog="tangram bench costs")
    parser.add_argument("--repeat", type=int, default=5, help="independent runs")
    parser.add_argument("--n", type=int, default=40, help="samples per figure and run")
    parser.add_argument("--image", default=DEFAULT_TAG, help="the sandbox image")
    parser.add_argument("--docker-url", default=None,
                        help="a Docker engine (default: TANGRAM_SANDBOX_DOCKER_URL)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--sim-file", type=Path, default=SIM_FILE,
                        help="where the simulator reads the costs from")
    args = parser.parse_args(argv)
    given = list(sys.argv[1:] if argv is None else argv)
    command = "tangram bench costs " + shlex.join(given)
    settings = Settings.from_env()
    engine = engine_of(args.docker_url or settings.sandbox.docker_url, args.image)
    runs = []
    for i in range(args.repeat):
        act, exec_s = stack_run(settings, args.n)
        docker_exec, docker_start = docker_run(engine, args.image, args.n)
        runs.append(Run(act, exec_s, docker_exec, docker_start))
        print(f"run {i + 1}/{args.repeat}: {runs[-1]}", file=sys.stderr)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    data = measured(runs, command, when, f"a shared {os.cpu_count()}-core machine")
    text = section_text(data)
    folder = args.out / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{NAME}.json").write_text(json.dumps(data, indent=1) + "\n")
    args.sim_file.write_text(json.dumps(data, indent=1) + "\n")
    publish(args.out, NAME, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
