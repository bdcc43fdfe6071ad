"""Reward-serving benchmark on the real tritonserver: latency, restore time, batching gain.

For each model of the repository (or those named with ``--model``):

* **load (restore) time**: load under a per-chunk name, exactly as the GPU manager does (config
  override + uploaded ``model.py``, one instance), p50 over ``--loads`` load/unload cycles;
* **p50 / p90 latency** of one-row requests sent one after another;
* **throughput against concurrency** (``--concurrency 1,8,32,64``: a GRPO step scores hundreds of
  responses at once) with the config's dynamic batching and with it removed (each request executes
  alone). Both variants are loaded side by side on the same server from the same ``model.py``,
  one CPU instance each, and get the same one-row requests from the same client: a single asyncio
  event loop with ``concurrency`` closed-loop senders (``tritonclient``'s gRPC or HTTP aio client),
  taking turns through a fixed pool of varied requests (:func:`samples`). The points are measured
  in ``--rounds`` interleaved rounds (batched first in even rounds, unbatched first in odd ones) so
  that the load of a shared machine falls on both; a point reports the median of its rounds, the
  ratio of the medians, the lowest and highest per-round ratio, and the rows per execution that
  Triton's statistics API counted for the batched variant.

Run: ``python -m tangram_celery.bench.reward`` (starts its own server on free ports; ``--url``
uses a running one). The table's header carries the machine's load average before and after.

``--perf-analyzer PATH`` also measures both variants with NVIDIA's ``perf_analyzer`` at the same
points, in the same interleaved rounds, with the same request pool (``--input-data``) and
protocol. The PyPI ``perf-analyzer`` package is an empty placeholder; the binary ships in the
``tritonclient`` manylinux wheels. In a separate virtual environment (never the project's)::

    python -m venv /tmp/pa && /tmp/pa/bin/pip install --no-deps tritonclient==2.51.0 \\
        nvidia-cuda-runtime-cu12
    apt-get install -y libb64-0d
    printf '#!/bin/sh\\nLD_LIBRARY_PATH=%s exec /tmp/pa/bin/perf_analyzer "$@"\\n' \\
        "$(echo /tmp/pa/lib/python3.*/site-packages/nvidia/cuda_runtime/lib)" > /tmp/pa.sh
    chmod +x /tmp/pa.sh        # then: --perf-analyzer /tmp/pa.sh

The binary needs ``libcudart.so.12`` even on CPU (hence ``nvidia-cuda-runtime-cu12``); the
``tritonclient==2.41.0`` wheel carries one too (``tritonclient-2.41.0.data/data/bin/``). Its own
stability check is relaxed (``-s 100``: noise is handled by the interleaved rounds); each figure is
its throughput over its last three measurement windows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tangram_celery.reward.executor import default_repository
from tangram_celery.reward.repository import ModelSpec, load_repository
from tangram_celery.reward.server import TritonServer
from tangram_celery.reward.triton import Protocol, TritonClient

CPU_ONE = [{"kind": "KIND_CPU", "count": 1}]
DEFAULT_CONCURRENCY = (1, 8, 32, 64)
POOL_SIZE = 128

SENTENCES = (
    "The cat sat quietly on the warm windowsill.",
    "A cat was resting on the window ledge in the sun.",
    "The function returns the sum of the two numbers.",
    "We first sort the list and then remove the duplicates.",
    "The train to the city leaves every twenty minutes in the morning.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "The answer follows from applying the triangle inequality twice.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen.",
    "The committee postponed its decision until the next meeting.",
    "Each test case checks one edge of the input range.",
    "She planted tomatoes, beans and a row of sunflowers along the fence.",
    "The algorithm runs in linear time because every element is visited once.",
    "Heavy rain flooded several streets near the river overnight.",
    "Multiply both sides by the denominator to clear the fraction.",
    "The library opens at nine and closes at six on weekdays.",
    "A binary search halves the remaining interval at every step.",
    "The recipe needs two cups of flour, one egg and a pinch of salt.",
    "Our model predicts the next token from the previous ones.",
    "The bridge was closed for repairs during the summer.",
    "Dividing by zero is undefined, so that case is excluded.",
    "Several birds gathered around the feeder in the garden.",
    "The proof proceeds by induction on the length of the sequence.",
    "He forgot his umbrella and got soaked on the way home.",
    "The server answers each request with a single reward value.",
)
REASONING = (
    "Let us compute this step by step.",
    "First we add the two partial results.",
    "Then we simplify the fraction.",
    "Checking the units, the result is consistent.",
    "We substitute the value back into the equation.",
    "The remaining terms cancel out.",
    "This matches the condition given in the problem.",
    "Rounding is not needed here.",
)
GENERIC_SAMPLE = {"response": "42", "reference": "42"}


def _answer_pair(rng: random.Random) -> dict[str, str]:
    """One (response, reference) pair for answer_match: a reasoning prefix, a final answer in one
    of the forms the model reads, right about two times in three."""
    numerator, denominator = rng.randint(1, 9), rng.choice((2, 4, 5, 8))
    value = rng.randint(2, 99_999)
    forms = [
        (f"\\boxed{{\\frac{{{numerator}}}{{{denominator}}}}}", f"{numerator / denominator:g}"),
        (f"\\boxed{{{value:,}}}", str(value)),
        (f"#### {value}", f"{value}"),
        (f"The answer is {value}.", f"${value}$"),
        (f"so the answer: \\boxed{{x = {value}}}", str(value)),
    ]
    answer, reference = rng.choice(forms)
    if rng.random() < 0.35:
        reference = str(value + rng.randint(1, 9))
    steps = " ".join(rng.choice(REASONING) for _ in range(rng.randint(0, 12)))
    return {"response": f"{steps} {answer}".strip(), "reference": reference}


def _similarity_pair(rng: random.Random) -> dict[str, str]:
    """One pair for semantic_similarity: a response of 1-6 sentences, a reference of 1-2."""
    response = " ".join(rng.choice(SENTENCES) for _ in range(rng.randint(1, 6)))
    reference = " ".join(rng.choice(SENTENCES) for _ in range(rng.randint(1, 2)))
    return {"response": response, "reference": reference}


PAIR_MAKERS: dict[str, Callable[[random.Random], dict[str, str]]] = {
    "answer_match": _answer_pair,
    "semantic_similarity": _similarity_pair,
}


def samples(model: str, size: int = POOL_SIZE, seed: int = 0) -> list[dict[str, str]]:
    """The fixed pool of one-row requests for ``model`` (deterministic for a seed).

    Responses differ in length and form, as a rollout's do; a model without a generator gets
    one generic pair repeated.
    """
    maker = PAIR_MAKERS.get(model)
    if maker is None:
        return [dict(GENERIC_SAMPLE) for _ in range(size)]
    rng = random.Random(f"{model}:{seed}")
    return [maker(rng) for _ in range(size)]


@dataclass(frozen=True)
class Point:
    """Both variants at one concurrency: requests per second per round, in round order."""

    concurrency: int
    batched: tuple[float, ...]
    unbatched: tuple[float, ...]
    rows_per_execution: float | None = None

    @property
    def batched_rps(self) -> float:
        """Median over the rounds, with dynamic batching."""
        return statistics.median(self.batched)

    @property
    def unbatched_rps(self) -> float:
        """Median over the rounds, without."""
        return statistics.median(self.unbatched)

    @property
    def ratio(self) -> float:
        """Median batched over median unbatched throughput."""
        return self.batched_rps / self.unbatched_rps if self.unbatched_rps else 0.0

    @property
    def round_ratios(self) -> tuple[float, ...]:
        """Batched over unbatched in each round (the rounds measured the two side by side)."""
        return tuple(b / u if u else 0.0 for b, u in zip(self.batched, self.unbatched,
                                                         strict=True))

    def summary(self) -> dict[str, Any]:
        """The point as JSON-safe values."""
        ratios = self.round_ratios
        return asdict(self) | {"batched_rps": self.batched_rps,
                               "unbatched_rps": self.unbatched_rps, "ratio": self.ratio,
                               "ratio_min": min(ratios), "ratio_max": max(ratios)}


@dataclass(frozen=True)
class ModelResult:
    """The figures of one model."""

    model: str
    load_p50_s: float
    latency_p50_ms: float
    latency_p90_ms: float
    points: tuple[Point, ...]
    pa_points: tuple[Point, ...] = field(default=())

    def summary(self) -> dict[str, Any]:
        """The result as JSON-safe values."""
        return {"model": self.model, "load_p50_s": self.load_p50_s,
                "latency_p50_ms": self.latency_p50_ms, "latency_p90_ms": self.latency_p90_ms,
                "points": [p.summary() for p in self.points],
                "perf_analyzer": [p.summary() for p in self.pa_points]}


PA_THROUGHPUT = re.compile(r"Concurrency: \d+, throughput: ([0-9.]+) infer/sec")


def perf_analyzer_data(pool: Sequence[Mapping[str, str]]) -> dict[str, Any]:
    """``perf_analyzer``'s ``--input-data`` JSON for a request pool (one row per request)."""
    return {"data": [{key: [value] for key, value in row.items()} for row in pool]}


def perf_analyzer_rps(binary: Path, url: str, protocol: Protocol, name: str, data: Path,
                      concurrency: int, window_ms: int) -> float:
    """Throughput ``perf_analyzer`` measures for ``name`` at ``concurrency``."""
    done = subprocess.run(  # nosec B603 # a binary the user names, argv without a shell
        [str(binary), "-m", name, "-u", url, "-i", protocol, "--async",
         "--concurrency-range", str(concurrency), "--input-data", str(data),
         "--measurement-interval", str(window_ms), "-s", "100", "-r", "10"],
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


def measure_latency(client: TritonClient, spec: ModelSpec, name: str,
                    pool: Sequence[Mapping[str, str]], requests: int) -> list[float]:
    """Seconds per one-row request, sent sequentially through the pool (after a warm-up)."""
    encoded = [spec.encode(row)[0] for row in pool]
    for arrays in encoded[:5]:
        client.infer(name, spec, arrays)
    latencies = []
    for k in range(requests):
        started = time.perf_counter()
        client.infer(name, spec, encoded[k % len(encoded)])
        latencies.append(time.perf_counter() - started)
    return latencies


def _aio_module(protocol: Protocol) -> Any:
    if protocol == "grpc":
        import tritonclient.grpc.aio as module
    else:
        import tritonclient.http.aio as module
    return module


async def _rows_counted(client: Any, protocol: Protocol, name: str) -> tuple[int, int]:
    """(inference count, execution count) of ``name`` from Triton's statistics API."""
    if protocol == "grpc":
        raw = await client.get_inference_statistics(name, as_json=True)
    else:
        raw = await client.get_inference_statistics(name)
    stats = raw["model_stats"][0]
    return int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0))


async def closed_loop(url: str, protocol: Protocol, spec: ModelSpec, name: str,
                      pool: Sequence[Mapping[str, str]], concurrency: int,
                      seconds: float) -> tuple[float, float | None]:
    """Requests per second of ``concurrency`` closed-loop senders on one event loop, and the rows
    per execution Triton counted meanwhile.

    The senders take the pool's requests in turn (a shared cursor), so every variant sees the
    same sequence. The first ``concurrency`` requests warm up; completions are counted over a
    window of ``seconds``.
    """
    module = _aio_module(protocol)
    requests = []
    for row in pool:
        arrays, _ = spec.encode(row)
        inputs = []
        for tensor in spec.inputs:
            item = module.InferInput(tensor.name, list(arrays[tensor.name].shape), tensor.datatype)
            item.set_data_from_numpy(arrays[tensor.name])
            inputs.append(item)
        requests.append(inputs)
    outputs = [module.InferRequestedOutput(t.name) for t in spec.outputs]
    kwargs = {"conn_limit": concurrency + 1} if protocol == "http" else {}  # + statistics
    client = module.InferenceServerClient(url.removeprefix("http://").removeprefix("grpc://"),
                                          **kwargs)
    cursor = 0
    done = 0
    measuring = True

    async def sender() -> None:
        nonlocal cursor, done
        while measuring:
            inputs = requests[cursor % len(requests)]
            cursor += 1
            result = await client.infer(name, inputs, outputs=outputs)
            result.as_numpy(spec.outputs[0].name)
            done += 1

    try:
        await asyncio.gather(*(client.infer(name, requests[k % len(requests)], outputs=outputs)
                               for k in range(concurrency)))
        tasks = [asyncio.create_task(sender()) for _ in range(concurrency)]
        try:
            before = await _rows_counted(client, protocol, name)
            start_done, started = done, time.perf_counter()
            await asyncio.sleep(seconds)
            end_done, elapsed = done, time.perf_counter() - started
            after = await _rows_counted(client, protocol, name)
        finally:
            measuring = False
            results = await asyncio.gather(*tasks, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
    finally:
        await client.close()
    executions = after[1] - before[1]
    rows = (after[0] - before[0]) / executions if executions > 0 else None
    return (end_done - start_done) / elapsed, rows


def interleaved(concurrencies: Sequence[int], rounds: int,
                measure: Callable[[bool, int], tuple[float, float | None]]) -> list[Point]:
    """Run ``measure(batching, concurrency)`` for both variants at every point in ``rounds``
    rounds (batched first in even rounds, unbatched first in odd ones)."""
    figures: dict[tuple[int, bool], list[float]] = {}
    rows: dict[int, list[float]] = {}
    for round_ in range(rounds):
        order = (True, False) if round_ % 2 == 0 else (False, True)
        for concurrency in concurrencies:
            for batching in order:
                rps, per_execution = measure(batching, concurrency)
                figures.setdefault((concurrency, batching), []).append(rps)
                if batching and per_execution is not None:
                    rows.setdefault(concurrency, []).append(per_execution)
    return [
        Point(concurrency=c, batched=tuple(figures[(c, True)]),
              unbatched=tuple(figures[(c, False)]),
              rows_per_execution=statistics.median(rows[c]) if c in rows else None)
        for c in concurrencies
    ]


def variant_name(model: str, batching: bool) -> str:
    """The bench's name for one variant of ``model``."""
    return f"{model}__bench_{'batched' if batching else 'unbatched'}"


def bench_model(
    make_client: Callable[[], TritonClient],
    spec: ModelSpec,
    url: str,
    protocol: Protocol,
    *,
    loads: int,
    requests: int,
    concurrencies: Sequence[int],
    rounds: int,
    seconds: float,
    perf_analyzer: Path | None = None,
    parameters: Mapping[str, str] | None = None,
) -> ModelResult:
    """Every figure of one model; loads and unloads its own bench names. ``parameters``
    override config parameters of both variants alike (e.g. ``cpu_threads``)."""
    client = make_client()
    pool = samples(spec.name)
    names = {b: variant_name(spec.name, b) for b in (True, False)}
    try:
        load_p50 = measure_load(client, spec, f"{spec.name}__bench_load", loads)
        for batching, name in names.items():
            config = spec.override(name, CPU_ONE, parameters, dynamic_batching=batching)
            client.load(name, config=config, files=spec.files)
        try:
            latencies = measure_latency(client, spec, names[True], pool, requests)

            def ours(batching: bool, concurrency: int) -> tuple[float, float | None]:
                return asyncio.run(closed_loop(url, protocol, spec, names[batching], pool,
                                               concurrency, seconds))

            points = interleaved(concurrencies, rounds, ours)
            pa_points: list[Point] = []
            if perf_analyzer is not None:
                with tempfile.NamedTemporaryFile("w", suffix=".json") as data:
                    json.dump(perf_analyzer_data(pool), data)
                    data.flush()
                    window_ms = max(500, round(seconds * 1000))

                    def theirs(batching: bool, concurrency: int) -> tuple[float, float | None]:
                        return perf_analyzer_rps(perf_analyzer, url, protocol, names[batching],
                                                 Path(data.name), concurrency, window_ms), None

                    pa_points = interleaved(concurrencies, rounds, theirs)
        finally:
            for name in names.values():
                client.unload(name)
    finally:
        client.close()
    return ModelResult(
        model=spec.name,
        load_p50_s=load_p50,
        latency_p50_ms=percentile(latencies, 0.5) * 1000,
        latency_p90_ms=percentile(latencies, 0.9) * 1000,
        points=tuple(points),
        pa_points=tuple(pa_points),
    )


def _point_line(label: str, point: Point) -> str:
    ratios = point.round_ratios
    rows = f"{point.rows_per_execution:>10.1f}" if point.rows_per_execution is not None else ""
    return (f"  {label:<15}{point.concurrency:>5}{point.batched_rps:>14.0f}"
            f"{point.unbatched_rps:>16.0f}{point.ratio:>8.2f}x"
            f"   {min(ratios):.2f}-{max(ratios):.2f}x{rows}")


def render(results: Sequence[ModelResult], header: str) -> str:
    """The printed table."""
    lines = [header]
    for r in results:
        lines.append(f"{r.model}: load p50 {r.load_p50_s:.2f} s, one-by-one latency p50 "
                     f"{r.latency_p50_ms:.2f} ms, p90 {r.latency_p90_ms:.2f} ms")
        lines.append(f"  {'client':<15}{'conc':>5}{'batched rps':>14}{'unbatched rps':>16}"
                     f"{'ratio':>9}   {'rounds':<11}{'rows/exec':>10}")
        lines += [_point_line("ours (aio)", p) for p in r.points]
        lines += [_point_line("perf_analyzer", p) for p in r.pa_points]
    return "\n".join(lines)


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as ``uptime`` prints them."""
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


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
                url,
                protocol,
                loads=args.heavy_loads if heavy else args.loads,
                requests=args.requests // 8 if heavy else args.requests,
                concurrencies=args.concurrency,
                rounds=args.rounds,
                seconds=args.seconds,
                perf_analyzer=args.perf_analyzer,
                parameters=dict(args.param),
            )
        )
    return results


def concurrency_list(raw: str) -> list[int]:
    """``"1,8,32"`` as a list of positive integers."""
    try:
        values = [int(part) for part in raw.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r}: give integers, e.g. 1,8,32,64") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{raw!r}: give positive integers, e.g. 1,8,32,64")
    return values


def parameter(raw: str) -> tuple[str, str]:
    """``"KEY=VALUE"`` as a pair."""
    key, sep, value = raw.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{raw!r}: give KEY=VALUE, e.g. cpu_threads=1")
    return key.strip(), value


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, start a server unless ``--url``, print the table (or JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=default_repository())
    parser.add_argument("--url", help="host:port of a running server (default: start one)")
    parser.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    parser.add_argument("--model", action="append", help="model to benchmark (default: all)")
    parser.add_argument("--concurrency", type=concurrency_list, default=list(DEFAULT_CONCURRENCY),
                        help="comma-separated concurrencies (default 1,8,32,64)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per point")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="measurement window per point and variant (also perf_analyzer's)")
    parser.add_argument("--requests", type=int, default=400, help="sequential latency requests")
    parser.add_argument("--loads", type=int, default=5, help="load cycles for light models")
    parser.add_argument("--heavy-loads", type=int, default=2, help="load cycles for MiniLM")
    parser.add_argument("--param", type=parameter, action="append", default=[],
                        metavar="KEY=VALUE",
                        help="override a config parameter of both variants (repeatable)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--perf-analyzer", type=Path,
                        help="also measure with this perf_analyzer binary (see the docstring)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.seconds <= 0:
        parser.error("--rounds must be >= 1 and --seconds > 0")
    before = load_average()
    if args.url:
        results = run(args, args.url)
    else:
        with TritonServer(args.repository) as server:
            url = server.http_url if args.protocol == "http" else server.grpc_url
            results = run(args, url)
    overrides = "".join(f", {key}={value}" for key, value in args.param)
    header = (
        f"reward benchmark: tritonserver (nvidia-pytriton), python backend, one CPU instance "
        f"per variant{overrides}, {args.protocol}, {args.rounds} interleaved rounds of "
        f"{args.seconds:g} s, {os.cpu_count()} cores, load average {before} before, "
        f"{load_average()} after"
    )
    if args.json:
        print(json.dumps({"header": header, "models": [r.summary() for r in results]}, indent=2))
    else:
        print(render(results, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
