"""Reward-serving benchmark on the real tritonserver: latency, restore time, batching gain.

For each model of the repository (or those named with ``--model``):

* **load (restore) time**: load under a per-chunk name, exactly as the GPU manager does (config
  override + uploaded ``model.py``, one instance), p50 over ``--loads`` load/unload cycles;
* **p50 / p90 latency** of one-row requests sent one after another;
* **throughput at concurrency 8** (``--concurrency``) with the config's dynamic batching and with
  it removed (each request executes alone), each on one instance, and their ratio.

Run: ``python -m tangram_celery.bench.reward`` (starts its own server on free ports; ``--url``
uses a running one). Clients are one per thread, as ``tritonclient`` requires.

``--perf-analyzer PATH`` also measures both variants with NVIDIA's ``perf_analyzer`` at the same
concurrency (HTTP). The PyPI ``perf-analyzer`` package is a placeholder; the binary ships in the
``tritonclient==2.41.0`` manylinux wheel (``tritonclient-2.41.0.data/data/bin/perf_analyzer``)
and needs Debian's ``libb64-0d`` and ``libcudart.so.12`` (PyPI ``nvidia-cuda-runtime-cu12``) on
``LD_LIBRARY_PATH``, even on CPU.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import tempfile
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
    pa_batched_rps: float | None = None
    pa_unbatched_rps: float | None = None

    @property
    def ratio(self) -> float:
        """Throughput with dynamic batching over without."""
        return self.batched_rps / self.unbatched_rps if self.unbatched_rps else 0.0

    @property
    def pa_ratio(self) -> float | None:
        """The same ratio as ``perf_analyzer`` measured it (None when it was not run)."""
        if not self.pa_batched_rps or not self.pa_unbatched_rps:
            return None
        return self.pa_batched_rps / self.pa_unbatched_rps


PA_THROUGHPUT = re.compile(r"Concurrency: \d+, throughput: ([0-9.]+) infer/sec")


def perf_analyzer_rps(binary: Path, url: str, name: str, sample: dict[str, str],
                      concurrency: int) -> float:
    """Throughput ``perf_analyzer`` measures for ``name`` at ``concurrency`` over HTTP."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as data:
        json.dump({"data": [{key: [value] for key, value in sample.items()}]}, data)
        data.flush()
        done = subprocess.run(  # nosec B603 # a binary the user names, argv without a shell
            [str(binary), "-m", name, "-u", url.removeprefix("http://"), "-i", "http",
             "--concurrency-range", str(concurrency), "--input-data", data.name,
             "--measurement-interval", "4000"],
            capture_output=True, text=True, timeout=300, check=False,
        )
    match = PA_THROUGHPUT.search(done.stdout)
    if match is None:
        raise RuntimeError(f"perf_analyzer gave no throughput (exit {done.returncode}): "
                           f"{(done.stdout + done.stderr)[-800:]}")
    return float(match.group(1))


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
    perf_analyzer: tuple[Path, str] | None = None,
) -> ModelResult:
    """Every figure of one model; loads and unloads its own bench names. ``perf_analyzer`` is
    the binary and the server's HTTP URL, to measure each variant with it as well."""
    client = make_client()
    pa: dict[bool, float] = {}
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
                if perf_analyzer is not None:
                    pa[batching] = perf_analyzer_rps(
                        perf_analyzer[0], perf_analyzer[1], name,
                        SAMPLE.get(spec.name, GENERIC_SAMPLE), concurrency)
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
        pa_batched_rps=pa.get(True),
        pa_unbatched_rps=pa.get(False),
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
        if r.pa_ratio is not None:
            lines.append(f"{'  perf_analyzer':<49}{r.pa_batched_rps:>18.0f}"
                         f"{r.pa_unbatched_rps:>20.0f}{r.pa_ratio:>7.1f}x")
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
                perf_analyzer=(args.perf_analyzer, url) if args.perf_analyzer else None,
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
    parser.add_argument("--perf-analyzer", type=Path,
                        help="also measure with this perf_analyzer binary (HTTP only)")
    args = parser.parse_args(argv)
    if args.perf_analyzer and args.protocol != "http":
        parser.error("--perf-analyzer measures over HTTP: drop --protocol grpc")
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
        payload: list[dict[str, Any]] = [asdict(r) | {"ratio": r.ratio, "pa_ratio": r.pa_ratio}
                                         for r in results]
        print(json.dumps(payload, indent=2))
    else:
        print(render(results, header, args.concurrency))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
