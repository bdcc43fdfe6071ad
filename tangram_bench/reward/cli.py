"""Reward-serving benchmark on the real tritonserver: latency, restore time, batching gain.

The command line of :mod:`tangram_bench.reward`. Run: ``python -m
tangram_bench.reward`` (starts its own server on free ports; ``--url`` uses a running
one). The table's header carries the machine's load average before and after. ``--out DIR``
also writes the section ``DIR/bench/reward-batching.md`` and rebuilds ``DIR/results.md``.

``--perf-analyzer PATH`` also measures both variants with NVIDIA's ``perf_analyzer`` (how to get
the binary: :mod:`tangram_bench.reward.perf_analyzer`).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from tangram_bench.report import publish
from tangram_bench.reward.measure import bench_model
from tangram_bench.reward.results import NAME, ModelResult, render, section_text
from tangram_celery.reward.executor import default_repository
from tangram_celery.reward.repository import load_repository
from tangram_celery.reward.server import TritonServer
from tangram_celery.reward.triton import Protocol, TritonClient
from tangram_celery.settings import Settings

DEFAULT_CONCURRENCY = (1, 8, 32, 64)


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as ``uptime`` prints them."""
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


def run(args: argparse.Namespace, url: str, key: str = "") -> list[ModelResult]:
    """Benchmark the selected models against the server at ``url`` (``key``: its
    ``TANGRAM_TRITON_KEY``, for the loads and unloads)."""
    specs = load_repository(args.repository)
    names = args.model or sorted(specs)
    protocol: Protocol = args.protocol

    def make_client() -> TritonClient:
        return TritonClient(url, protocol, key=key)

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
    parser = argparse.ArgumentParser(prog="python -m tangram_bench.reward",
                                     description=__doc__.splitlines()[0])
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
    parser.add_argument("--out", type=Path, default=None,
                        help="also write the section DIR/bench/reward-batching.md (and .json) "
                             "and rebuild DIR/results.md")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.seconds <= 0:
        parser.error("--rounds must be >= 1 and --seconds > 0")
    before = load_average()
    if args.url:
        results = run(args, args.url, Settings.from_env().triton.key)
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
    if args.out is not None:
        given = list(sys.argv[1:] if argv is None else argv)
        folder = args.out / "bench"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{NAME}.json").write_text(json.dumps(
            {"header": header, "models": [r.summary() for r in results]}, indent=1))
        publish(args.out, NAME, section_text(
            results, header, "python -m tangram_bench.reward " + shlex.join(given)))
    return 0
