"""Per-action overhead of tangram, side by side with raw Celery and the no-isolation baseline.

    tangram bench overhead [--json] [--n 60] [--rounds 3] [--docker-url URL]
    python -m tangram_bench.overhead ...

One run, interleaved in rounds, on one Redis (``TANGRAM_REDIS_URL`` if it answers, else an
embedded one) with real worker subprocesses (one CPU node of 2 cores), the baseline server of
:mod:`tangram_bench.baseline` (a subprocess per request, no isolation, no queue) and, in
this process, a bubblewrap backend and (when an engine answers) a Docker backend. Reported, as
p50 milliseconds unless named ``_per_s``:

- ``raw_celery_p50_ms``: a raw Celery no-op round trip; ``tangram_trivial_p50_ms``: a ``true``
  action through the whole system (client, Redis, node, sandbox);
- ``warm_exec_p50_ms`` (``true``; also ``warm_exec_true_p50_ms``) and ``warm_exec_print_p50_ms``
  (a Python ``print(1)``): ``run()`` on the bubblewrap backend in a live trajectory;
  ``cold_start_p50_ms``: its first action in a fresh trajectory; ``docker_warm_exec_p50_ms``:
  ``true`` in a live trajectory of the Docker backend; ``fork_exec_floor_p50_ms``: this
  machine's floor for any of them, a bare fork, exec of ``/bin/sh -c true`` and wait from a
  small stdlib Python process like the executor (no sandbox, no pipes, no cgroup);
- ``print_seq_p50_ms`` / ``baseline_print_seq_p50_ms``: sequential ``print(1)`` requests;
- ``print_32_inflight_per_s`` / ``baseline_print_32_inflight_per_s``: ``print(1)`` throughput
  with 32 requests in flight (32 trajectories);
- ``cpu_32_inflight_per_s``: a ~0.19 s CPU-bound snippet with 32 in flight, against
  ``cpu_ceiling_per_s`` = the node's cores / the snippet's time alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from celery import Celery

from tangram_bench import overhead_probes as probes
from tangram_bench.overhead_report import report_of, table_of
from tangram_bench.overhead_rig import Rig, open_rig
from tangram_celery.action import ActionResult
from tangram_celery.client import TangramClient, command_action
from tangram_celery.client.waiter import ResultWaiter
from tangram_celery.connection import connect
from tangram_celery.processes import stop_process
from tangram_celery.settings import Settings
from tangram_celery.stack.demo import DemoConfig, local_cluster
from tangram_celery.tasks.app import celery_config

NOOP_QUEUE = "bench.noop"


def noop_app(settings: Settings) -> Celery:
    """A plain Celery app with tangram's transport settings and one no-op task."""
    app = Celery("bench-noop", set_as_current=False)
    app.conf.update(celery_config(settings))

    @app.task(name="bench.noop")  # type: ignore[untyped-decorator]
    def noop() -> None:
        return None

    return app


@contextlib.contextmanager
def noop_worker(settings: Settings, log: Path) -> Iterator[Celery]:
    """A raw Celery worker subprocess consuming the no-op queue."""
    argv = [sys.executable, "-m", "tangram_bench.overhead", "--serve-noop",
            settings.broker.redis_url]
    with open(log, "ab") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    app = noop_app(settings)
    try:
        app.send_task("bench.noop", queue=NOOP_QUEUE).get(timeout=30)
        yield app
    finally:
        stop_process(process)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def measure_raw(app: Celery, n: int, waiter: ResultWaiter | None = None) -> list[float]:
    """Round-trip seconds of ``n`` sequential no-op tasks, waited for with Celery's
    ``AsyncResult.get`` or, given a ``waiter``, with tangram's result waiter."""
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        handle = app.send_task("bench.noop", queue=NOOP_QUEUE)
        if waiter is None:
            handle.get(timeout=30)
        else:
            waiter.wait_for(app.backend.get_key_for_task(handle.id)).result(30)
        samples.append(time.perf_counter() - start)
    return samples


def measure_tangram(client: TangramClient, n: int) -> list[ActionResult]:
    """Sequential trivial actions in one trajectory (a warm environment)."""
    return [client.submit(command_action("bench-overhead", "true")).result(60)
            for _ in range(n)]


def run_rounds(app: Celery, client: TangramClient, waiter: ResultWaiter, rig: Rig, n: int,
               rounds: int) -> tuple[dict[str, list[float]], float]:
    """Every measurement, interleaved over ``rounds`` rounds; (samples, CPU snippet alone s)."""
    out = probes.Samples()
    run_id = os.urandom(3).hex()
    names = [f"bench-print-{run_id}", *(f"bench-p32-{run_id}-{i}" for i in range(32))]
    try:
        alone = _rounds(app, client, waiter, rig, n, rounds, out, names)
    finally:
        for trajectory_id in ("bench-overhead", *names):
            client.end_trajectory(trajectory_id)
    return out.values, alone


def _rounds(app: Celery, client: TangramClient, waiter: ResultWaiter, rig: Rig, n: int,
            rounds: int, out: probes.Samples, names: Sequence[str]) -> float:
    iterations, alone = probes.calibrate_cpu()
    warm_true = probes.warm_true(rig.bwrap, "bench-warm", rig.core)
    warm_print = probes.warm_print(rig.bwrap, "bench-warm", rig.core)
    docker_true = probes.warm_true(rig.docker, "bench-warm", rig.core) if rig.docker else None
    print_seq = probes.tangram_print(client, names[0])
    base_print = probes.baseline_print(rig.baseline_url)
    lanes = [probes.tangram_print(client, name) for name in names[1:]]
    cpu_lanes = [probes.tangram_cpu(client, name, iterations) for name in names[1:]]
    for call in (warm_true, warm_print, print_seq, base_print, *lanes):  # warm everything up
        call()
    measure_raw(app, 10)
    measure_tangram(client, 5)
    if docker_true is not None:
        probes.timed(docker_true, 3)
    per = max(n // rounds, 1)
    for _ in range(rounds):
        out.add("raw", measure_raw(app, per))
        out.add("raw_waiter", measure_raw(app, per, waiter))
        results = measure_tangram(client, per)
        out.add("tangram_trivial", [r.act["total"] for r in results])
        out.add("tangram_trivial_setup", [r.timings.setup_s for r in results])
        out.add("tangram_trivial_exec", [r.timings.exec_s for r in results])
        out.add("warm_true", probes.timed(warm_true, per))
        out.add("fork_exec", probes.fork_exec_floor(per))
        out.add("warm_print", probes.timed(warm_print, per))
        out.add("cold", probes.cold_starts(rig.bwrap, max(per // 3, 3), rig.core, "bench-cold"))
        if docker_true is not None:
            out.add("docker_warm", probes.timed(docker_true, max(per // 3, 3)))
        out.add("print_seq", probes.timed(print_seq, per))
        out.add("baseline_print_seq", probes.timed(base_print, per))
        out.add("print_32", [probes.inflight_rate(lanes, 3)])
        out.add("baseline_print_32", [probes.inflight_rate([base_print] * 32, 3)])
        out.add("cpu_32", [probes.inflight_rate(cpu_lanes, 1)])
    return alone


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print its table, or with ``--json`` one JSON object."""
    parser = argparse.ArgumentParser(prog="tangram bench overhead")
    parser.add_argument("--n", type=int, default=60, help="samples per latency, all rounds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    parser.add_argument("--docker-url", default=None,
                        help="a Docker engine for docker_warm_exec_p50_ms (default: "
                             "TANGRAM_SANDBOX_DOCKER_URL or the default socket)")
    parser.add_argument("--serve-noop", metavar="REDIS_URL", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_noop:
        app = noop_app(Settings.from_env({}, redis_url=args.serve_noop))
        app.worker_main(["worker", "-Q", NOOP_QUEUE, "-P", "threads", "-c", "2",
                         "--without-mingle", "--without-gossip", "-l", "WARNING"])
        return 0
    settings = Settings.from_env()
    with tempfile.TemporaryDirectory(prefix="tangram-bench-") as logs, \
            local_cluster(settings, DemoConfig(nodes=1, cores_per_node=2), Path(logs)) as live, \
            noop_worker(live, Path(logs) / "noop.log") as app, TangramClient(live) as client, \
            open_rig(live.sandbox, args.docker_url) as rig:
        waiter = ResultWaiter(connect(live.broker))
        try:
            samples, alone = run_rounds(app, client, waiter, rig, args.n, args.rounds)
        finally:
            waiter.close()
    report = report_of(samples, rig.docker_error, args.n, args.rounds, alone, cores=2)
    print(json.dumps(report) if args.json else table_of(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
