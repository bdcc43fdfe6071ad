"""The measurements of one model: load time, one-by-one latency, closed-loop throughput.

Both variants (with the config's dynamic batching and without) are loaded side by side from the
same ``model.py``, one CPU instance each, and measured in interleaved rounds by
:func:`bench_model`.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tangram_bench.reward.perf_analyzer import perf_analyzer_data, perf_analyzer_rps
from tangram_bench.reward.pool import samples
from tangram_bench.reward.results import ModelResult, Point
from tangram_celery.reward.repository import ModelSpec
from tangram_celery.reward.triton import Protocol, TritonClient

CPU_ONE = [{"kind": "KIND_CPU", "count": 1}]


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
