"""The reward benchmark: its request pool, its interleaving, and a short run on the real server."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tangram_bench.reward import cli as bench_cli
from tangram_bench.reward import measure as bench_measure
from tangram_bench.reward import perf_analyzer
from tangram_bench.reward import pool as request_pool
from tangram_celery.errors import ValidationError
from tangram_celery.reward.repository import ModelSpec, load_repository
from tangram_celery.reward.server import TritonServer
from tangram_celery.reward.triton import Protocol, TritonClient

REPOSITORY = Path(__file__).resolve().parents[2] / "triton_models"


def test_pools_are_fixed_varied_and_per_model() -> None:
    for model in ("answer_match", "semantic_similarity"):
        pool = request_pool.samples(model)
        assert pool == request_pool.samples(model)  # the same requests for every variant and run
        assert pool != request_pool.samples(model, seed=1)
        assert len(pool) == request_pool.POOL_SIZE
        assert set(pool[0]) == {"response", "reference"}
        lengths = {len(row["response"]) for row in pool}
        assert len(lengths) > 20  # responses differ in length, as a rollout's do
        assert len({row["response"] for row in pool}) > request_pool.POOL_SIZE // 2
    assert request_pool.samples("unknown_model", size=3) == [request_pool.GENERIC_SAMPLE] * 3


def test_interleaved_alternates_the_order_and_takes_medians() -> None:
    calls: list[tuple[bool, int]] = []
    figures = {True: iter([30.0, 10.0, 20.0, 300.0, 100.0, 200.0]),
               False: iter([10.0, 5.0, 20.0, 100.0, 50.0, 200.0])}

    def measure(batching: bool, concurrency: int) -> tuple[float, float | None]:
        calls.append((batching, concurrency))
        return next(figures[batching]), 4.0 if batching else None

    points = bench_measure.interleaved([1, 8], 3, measure)
    assert calls == [(True, 1), (False, 1), (True, 8), (False, 8),
                     (False, 1), (True, 1), (False, 8), (True, 8),
                     (True, 1), (False, 1), (True, 8), (False, 8)]
    one, eight = points
    assert (one.concurrency, one.batched, one.unbatched) == (1, (30.0, 20.0, 100.0),
                                                             (10.0, 20.0, 50.0))
    assert one.batched_rps == 30.0 and one.unbatched_rps == 20.0 and one.ratio == 1.5
    assert one.round_ratios == (3.0, 1.0, 2.0)
    assert one.rows_per_execution == 4.0
    assert eight.batched == (10.0, 300.0, 200.0) and eight.unbatched == (5.0, 100.0, 200.0)
    summary = eight.summary()
    assert summary["ratio_min"] == 1.0 and summary["ratio_max"] == 3.0


def test_concurrency_list_parses_and_rejects() -> None:
    assert bench_cli.concurrency_list("1, 8,32") == [1, 8, 32]
    for bad in ("", "0,8", "a", "8,-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench_cli.concurrency_list(bad)


def test_perf_analyzer_data_has_one_row_per_request() -> None:
    pool = request_pool.samples("answer_match", size=4)
    data = perf_analyzer.perf_analyzer_data(pool)
    assert len(data["data"]) == 4
    assert data["data"][2] == {"response": [pool[2]["response"]],
                               "reference": [pool[2]["reference"]]}


@pytest.fixture(scope="module")
def answer_match(triton_server: TritonServer) -> Iterator[ModelSpec]:
    spec = load_repository(REPOSITORY)["answer_match"]
    client = TritonClient(triton_server.http_url)
    names = [bench_measure.variant_name(spec.name, b) for b in (True, False)]
    for batching, name in zip((True, False), names, strict=True):
        config = spec.override(name, bench_measure.CPU_ONE, dynamic_batching=batching)
        client.load(name, config=config, files=spec.files)
    yield spec
    for name in names:
        client.unload(name)
    client.close()


def test_the_answer_match_pool_has_right_and_wrong_answers(
    triton_server: TritonServer, answer_match: ModelSpec
) -> None:
    pool = request_pool.samples("answer_match")
    client = TritonClient(triton_server.http_url)
    try:
        arrays, single = answer_match.encode({
            "response": [row["response"] for row in pool[:64]],
            "reference": [row["reference"] for row in pool[:64]],
        })
        name = bench_measure.variant_name("answer_match", True)
        rewards = answer_match.decode(client.infer(name, answer_match, arrays), single)["reward"]
    finally:
        client.close()
    assert {0.0, 1.0} == set(rewards)
    assert 0.3 < sum(rewards) / len(rewards) < 0.9


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_closed_loop_counts_requests_and_rows_per_execution(
    triton_server: TritonServer, answer_match: ModelSpec, protocol: Protocol
) -> None:
    url = triton_server.grpc_url if protocol == "grpc" else triton_server.http_url
    pool = request_pool.samples("answer_match")
    rows = {}
    for batching in (True, False):
        name = bench_measure.variant_name("answer_match", batching)
        rps, rows[batching] = asyncio.run(
            bench_measure.closed_loop(url, protocol, answer_match, name, pool, 16, 0.5))
        assert rps > 0
    assert rows[False] == 1.0  # without dynamic batching every request executes alone
    assert rows[True] is not None and rows[True] > 1.0  # 16 senders: Triton merged requests


def test_main_prints_every_point_as_json(
    triton_server: TritonServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code = bench_cli.main(["--url", triton_server.grpc_url, "--model", "answer_match",
                       "--concurrency", "1,4", "--rounds", "2", "--seconds", "0.2",
                       "--loads", "1", "--requests", "20", "--json"])
    assert code == 0
    payload = json.loads(capsys.readouterr().out)
    assert "load average" in payload["header"]
    (model,) = payload["models"]
    assert model["model"] == "answer_match" and model["perf_analyzer"] == []
    assert [p["concurrency"] for p in model["points"]] == [1, 4]
    for point in model["points"]:
        assert len(point["batched"]) == len(point["unbatched"]) == 2
        assert point["ratio"] == pytest.approx(point["batched_rps"] / point["unbatched_rps"])
        assert point["ratio_min"] <= point["ratio_max"]


def test_param_parses_and_reaches_the_variants(triton_server: TritonServer) -> None:
    assert bench_cli.parameter("cpu_threads=1") == ("cpu_threads", "1")
    with pytest.raises(argparse.ArgumentTypeError):
        bench_cli.parameter("cpu_threads")
    # A row limit below every pooled response: the bench's own requests are refused.
    with pytest.raises(ValidationError, match="limit 5"):
        bench_cli.main(["--url", triton_server.grpc_url, "--model", "answer_match", "--param",
                    "max_chars=5", "--concurrency", "1", "--rounds", "1", "--seconds", "0.2",
                    "--loads", "1", "--requests", "5"])


def test_the_section_names_its_command_and_each_ratio_with_its_range() -> None:
    from tangram_bench.reward.results import NAME, ModelResult, Point, section_text

    result = ModelResult("answer_match", 0.5, 2.0, 3.0,
                         (Point(1, (100.0, 90.0, 110.0), (100.0, 100.0, 100.0)),
                          Point(32, (300.0, 200.0, 250.0), (100.0, 100.0, 125.0))))
    text = section_text([result], "reward benchmark: a header", "python -m tangram_bench.reward "
                        "--out docs")
    assert text.startswith(f"## {NAME}\n\nCommand: `python -m tangram_bench.reward --out docs`")
    assert "| ours (aio) | 1 | 100 | 100 | 1.00x (0.90-1.10) |" in text
    assert "| ours (aio) | 32 | 250 | 100 | 2.50x (2.00-3.00) |" in text
    assert "Load p50 0.50 s; one-by-one latency p50 2.00 ms, p90 3.00 ms." in text
