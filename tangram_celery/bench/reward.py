"""Reward-serving benchmark on the real tritonserver: latency, restore time, batching gain.

For each model of the repository (or those named with ``--model``):

* **load (restore) time**: load under a per-chunk name, exactly as the GPU manager does (config
  override + uploaded ``model.py``, one instance), p50 over ``--loads`` load/unload cycles;
* **p50 / p90 latency** of one-row requests sent one after another;
* **throughput at concurrency 8** (``--concurrency``) with the config's dynamic batching and with
  it removed (each request executes alone), each on one instance, and their ratio.

Run: ``python -m tangram_celery.bench.reward`` (starts its own server on free ports; ``--url``
uses a running one). Clients are one per thread, as ``tritonclient`` requires.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tangram_celery.reward.executor import default_repository
from tangram_celery.reward.server import TritonServer
from tangram_celery.reward.triton import ModelSpec, Protocol, TritonClient, load_repository

SAMPLE = {
    "answer_match": {"response": "so the total is \\boxed{\\frac{3}{4}}", "reference": "0.75"},
    "semantic_similarity": {
        "response": "The cat sat quietly on the warm windowsill.",
        "reference": "A cat was resting on the window ledge in the sun.",
    },
}
GENERIC_SAMPLE = {"response": "42", "reference": "42"}
CPU_ONE = [{"kind": "KIND_CPU", "count": 1}]


@dataclass(frozen=True)
class ModelResult:
    """The figures of one model."""

    model: str
    load_p50_s: float
    latency_p50_ms: float
    latency_p90_ms: float
    batched_rps: float
    unbatched_rps: float

    @property
    def ratio(self) -> float:
        """Throughput with dynamic batching over without."""
        return self.batched_rps / self.unbatched_rps if self.unbatched_rps else 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def measure_load(client: TritonClient, spec: ModelSpec, name: str, loads: int) -> float:
    """p50 seconds of ``loads`` load/unload cycles of ``spec`` under ``name``."""
    times = []
    config = spec.override(name, CPU_ONE, {"tangram_gpus": "0", "tangram_simulated": "true"})
    for _ in range(loads):
        started = time.perf_counter()
        client.load(name, config=config, files=spec.files)
        times.append(time.perf_counter() - started)
        client.unload(name)
    return statistics.median(times)


def measure_latency(client: TritonClient, spec: ModelSpec, name: str, requests: int) -> list[float]:
    """Seconds per one-row request, sent sequentially (after a few warm-up requests)."""
    arrays, _ = spec.encode(SAMPLE.get(spec.name, GENERIC_SAMPLE))
    for _ in range(5):
        client.infer(name, spec, arrays)
    latencies = []
    for _ in range(requests):
        started = time.perf_counter()
        client.infer(name, spec, arrays)
        latencies.append(time.perf_counter() - started)
    return latencies


def measure_throughput(
    make_client: Callable[[], TritonClient],
    spec: ModelSpec,
    name: str,
    concurrency: int,
    per_thread: int,
) -> float:
    """Requests per second with ``concurrency`` threads, one client each."""
    arrays, _ = spec.encode(SAMPLE.get(spec.name, GENERIC_SAMPLE))
    barrier = threading.Barrier(concurrency + 1)
    errors: list[BaseException] = []

    def worker() -> None:
        client = make_client()
        try:
            client.infer(name, spec, arrays)
            barrier.wait()
            for _ in range(per_thread):
                client.infer(name, spec, arrays)
        except BaseException as exc:  # noqa: BLE001 - re-raised after the join
            errors.append(exc)
            barrier.abort()
        finally:
            client.close()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return concurrency * per_thread / elapsed


def bench_model(
    make_client: Callable[[], TritonClient],
    spec: ModelSpec,
    *,
    loads: int,
    requests: int,
    concurrency: int,
    per_thread: int,
) -> ModelResult:
    """Every figure of one model; loads and unloads its own bench names."""
    client = make_client()
    try:
        load_p50 = measure_load(client, spec, f"{spec.name}__bench_load", loads)
        rps = {}
        latencies: list[float] = []
        for batching in (True, False):
            name = f"{spec.name}__bench_{'batched' if batching else 'unbatched'}"
            config = spec.override(name, CPU_ONE, dynamic_batching=batching)
            client.load(name, config=config, files=spec.files)
            try:
                if batching:
                    latencies = measure_latency(client, spec, name, requests)
                rps[batching] = measure_throughput(
                    make_client, spec, name, concurrency, per_thread
                )
            finally:
                client.unload(name)
    finally:
        client.close()
    return ModelResult(
        model=spec.name,
        load_p50_s=load_p50,
        latency_p50_ms=percentile(latencies, 0.5) * 1000,
        latency_p90_ms=percentile(latencies, 0.9) * 1000,
        batched_rps=rps[True],
        unbatched_rps=rps[False],
    )


def render(results: Sequence[ModelResult], header: str, concurrency: int) -> str:
    """The printed table."""
    lines = [
        header,
        f"{'model':<22}{'load p50 s':>11}{'p50 ms':>9}{'p90 ms':>9}"
        f"{f'batched rps@{concurrency}':>18}{f'unbatched rps@{concurrency}':>20}{'ratio':>8}",
    ]
    for r in results:
        lines.append(
            f"{r.model:<22}{r.load_p50_s:>11.2f}{r.latency_p50_ms:>9.2f}{r.latency_p90_ms:>9.2f}"
            f"{r.batched_rps:>18.0f}{r.unbatched_rps:>20.0f}{r.ratio:>7.1f}x"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace, url: str) -> list[ModelResult]:
    """Benchmark the selected models against the server at ``url``."""
    specs = load_repository(args.repository)
    names = args.model or sorted(specs)
    protocol: Protocol = args.protocol

    def make_client() -> TritonClient:
        return TritonClient(url, protocol)

    results = []
    for name in names:
        heavy = name == "semantic_similarity"
        results.append(
            bench_model(
                make_client,
                specs[name],
                loads=args.heavy_loads if heavy else args.loads,
                requests=args.requests // 4 if heavy else args.requests,
                concurrency=args.concurrency,
                per_thread=args.per_thread // 4 if heavy else args.per_thread,
            )
        )
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, start a server unless ``--url``, print the table (or JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=default_repository())
    parser.add_argument("--url", help="host:port of a running server (default: start one)")
    parser.add_argument("--protocol", choices=["http", "grpc"], default="http")
    parser.add_argument("--model", action="append", help="model to benchmark (default: all)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=400, help="sequential latency requests")
    parser.add_argument("--per-thread", type=int, default=200, help="throughput requests/thread")
    parser.add_argument("--loads", type=int, default=5, help="load cycles for light models")
    parser.add_argument("--heavy-loads", type=int, default=2, help="load cycles for MiniLM")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    header = (
        f"reward benchmark: tritonserver (nvidia-pytriton), python backend, CPU instances, "
        f"{args.protocol}, concurrency {args.concurrency}"
    )
    if args.url:
        results = run(args, args.url)
    else:
        with TritonServer(args.repository) as server:
            url = server.http_url if args.protocol == "http" else server.grpc_url
            results = run(args, url)
    if args.json:
        payload: list[dict[str, Any]] = [asdict(r) | {"ratio": r.ratio} for r in results]
        print(json.dumps(payload, indent=2))
    else:
        print(render(results, header, args.concurrency))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
