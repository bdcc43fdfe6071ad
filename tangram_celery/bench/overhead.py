"""Per-action round-trip overhead of tangram against a raw Celery no-op task, side by side.

    python -m tangram_celery.bench.overhead [--n 200]

Both run on the same Redis (the one at ``TANGRAM_REDIS_URL`` if it answers, else an embedded
one) with real worker subprocesses. Reported: the raw ``apply_async().get()`` round trip of a
no-op task, tangram's round trip of a trivial sandboxed action (``true``) split into its ACT
parts, and tangram's overhead over the raw round trip.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from tangram_celery.action import ActionResult
from tangram_celery.client import TangramClient, command_action
from tangram_celery.client.waiter import ResultWaiter
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
    argv = [sys.executable, "-m", "tangram_celery.bench.overhead", "--serve-noop",
            settings.redis_url]
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


def summarize(
    raw: list[float], raw_waiter: list[float], results: list[ActionResult]
) -> dict[str, Any]:
    """p50/p99 in ms of the raw round trips and of tangram's ACT parts."""
    def ms(values: Sequence[float]) -> dict[str, float]:
        return {"p50": statistics.median(values) * 1000, "p99": percentile(values, 0.99) * 1000}

    parts = {p: ms([r.act[p] for r in results]) for p in ("total", "queue", "exec", "overhead")}
    setup = ms([r.timings.setup_s for r in results])
    return {
        "raw_celery_noop_ms": ms(raw),
        "raw_noop_tangram_waiter_ms": ms(raw_waiter),
        "tangram_ms": parts,
        "tangram_sandbox_setup_ms": setup,
        "tangram_minus_raw_p50_ms": parts["total"]["p50"] - ms(raw)["p50"],
        "ratio_total_p50": parts["total"]["p50"] / ms(raw)["p50"],
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print its table (and JSON with ``--json``)."""
    parser = argparse.ArgumentParser(prog="python -m tangram_celery.bench.overhead")
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve-noop", metavar="REDIS_URL")
    args = parser.parse_args(argv)
    if args.serve_noop:
        app = noop_app(Settings.from_env({}, redis_url=args.serve_noop))
        app.worker_main(["worker", "-Q", NOOP_QUEUE, "-P", "threads", "-c", "2",
                         "--without-mingle", "--without-gossip", "-l", "WARNING"])
        return 0
    settings = Settings.from_env()
    with tempfile.TemporaryDirectory(prefix="tangram-bench-") as logs, \
            local_cluster(settings, DemoConfig(nodes=1, cores_per_node=2), Path(logs)) as live, \
            noop_worker(live, Path(logs) / "noop.log") as app, TangramClient(live) as client:
        waiter = ResultWaiter(redis.Redis.from_url(live.redis_url))
        measure_raw(app, 20)
        measure_raw(app, 20, waiter)
        measure_tangram(client, 10)
        raw, raw_waiter, results = [], [], []
        for _ in range(5):
            raw += measure_raw(app, args.n // 5)
            raw_waiter += measure_raw(app, args.n // 5, waiter)
            results += measure_tangram(client, args.n // 5)
        waiter.close()
        client.end_trajectory("bench-overhead")
    report = summarize(raw, raw_waiter, results)
    if args.json:
        print(json.dumps(report, indent=2))
    raw_ms, t = report["raw_celery_noop_ms"], report["tangram_ms"]
    print(f"raw Celery no-op round trip      p50 {raw_ms['p50']:7.2f} ms  p99 {raw_ms['p99']:7.2f}"
          "  (AsyncResult.get)")
    waited = report["raw_noop_tangram_waiter_ms"]
    print(f"raw Celery no-op round trip      p50 {waited['p50']:7.2f} ms  p99 {waited['p99']:7.2f}"
          "  (tangram's result waiter)")
    for part in ("total", "queue", "exec", "overhead"):
        print(f"tangram trivial action {part:<9} p50 {t[part]['p50']:7.2f} ms  "
              f"p99 {t[part]['p99']:7.2f}")
    setup = report["tangram_sandbox_setup_ms"]["p50"]
    print(f"tangram sandbox setup            p50 {setup:7.2f} ms")
    print(f"tangram - raw (p50)              {report['tangram_minus_raw_p50_ms']:7.2f} ms  "
          f"(ratio {report['ratio_total_p50']:.2f}x vs AsyncResult.get), n={args.n}, "
          "interleaved in 5 rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
