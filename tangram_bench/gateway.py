"""``tangram bench gateway``: verl-style load on ``tangram gateway`` and the baseline, side by side.

    tangram bench gateway [--clients 1,8,32] [--cases 4] [--language python|cpp] [--json]
                          [--out docs]

Each client judges programs the way verl's ``check_correctness`` does: one ``/run_code`` request
per stdin/stdout test case, all cases of a program sent at once (with verl's payload: both
timeouts, ``memory_limit_MB`` 1024, empty ``files`` and ``fetch_files``), the next program when
every case has answered. The same programs and cases go, in one run, to the subprocess-per-request
baseline (:mod:`tangram_bench.baseline`: no isolation, no queue) and to a tangram gateway
process in front of one real CPU node worker holding this machine's cores (a private Redis), the
two systems alternating at each client count. Reported per system and client count: p50 and p90
of the request latency, throughput (requests per second) and the share of cases judged right,
then tangram's ratios (throughput tangram / baseline, p90 tangram / baseline) and, at the
fewest clients, where a tangram request's time went (from the gateway's ``X-Tangram-Timings``;
``client`` is the HTTP round trip and the client's side). The targets at 32 clients: throughput
ratio >= 2 and p90 ratio <= 1; at 1 client p50 ratio <= 1. With ``--out DIR`` it also writes
the section ``DIR/bench/gateway-<language>.md`` (and ``.json``) and rebuilds ``DIR/results.md``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime
import json
import math
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tangram_bench.baseline import SPLIT_KEY, run_code, start_baseline
from tangram_bench.report import publish
from tangram_celery.gateway.launch import spawn_gateway, wait_for_gateway
from tangram_celery.processes import free_port, stop_process
from tangram_celery.settings import Settings
from tangram_celery.stack.broker import embedded_redis
from tangram_celery.stack.demo import DemoConfig, local_cluster

REQUEST_TIMEOUT_S = 300.0
SPLIT_PARTS = ("client", "gateway", "broker", "sandbox", "program")
Program = tuple[str, list[tuple[str, str]]]
"""(code, [(stdin, expected stdout), ...])."""


def python_programs(cases: int) -> list[Program]:
    """Small competitive-programming solutions with ``cases`` stdin/stdout cases each."""
    solutions: list[tuple[str, Callable[[int], tuple[str, str]]]] = [
        ("a, b = map(int, input().split())\nprint(a + b)\n",
         lambda k: (f"{k} {2 * k + 1}\n", f"{3 * k + 1}\n")),
        ("n = int(input())\nprint(sum(i * i for i in range(n)))\n",
         lambda k: (f"{1000 * (k + 1)}\n", f"{sum(i * i for i in range(1000 * (k + 1)))}\n")),
        ("s = input().strip()\nprint(s[::-1])\n",
         lambda k: (f"tangram{k}\n", f"{('tangram' + str(k))[::-1]}\n")),
        ("xs = sorted(map(int, input().split()))\nprint(' '.join(map(str, xs)))\n",
         lambda k: (" ".join(str((7 * i + k) % 11) for i in range(9)) + "\n",
                    " ".join(map(str, sorted((7 * i + k) % 11 for i in range(9)))) + "\n")),
    ]
    return [(code, [make(k) for k in range(cases)]) for code, make in solutions]


def cpp_programs(cases: int) -> list[Program]:
    """The same kind of solutions in C++ (each request compiles, as SandboxFusion does)."""
    code = ("#include <iostream>\nint main() { long a, b; std::cin >> a >> b; "
            "std::cout << a + b << std::endl; return 0; }\n")
    return [(code, [(f"{k} {k + 1}\n", f"{2 * k + 1}\n") for k in range(cases)])]


@dataclass(frozen=True)
class Point:
    """One system at one client count: what its requests measured."""

    system: str
    clients: int
    requests: int
    p50_ms: float
    p90_ms: float
    throughput_rps: float
    correct: float
    split_ms: dict[str, float] | None = None
    """Mean milliseconds per part of a request (tangram: client and HTTP, gateway, broker,
    sandbox, program)."""


def verl_request(code: str, stdin: str, language: str, timeout: int = 10) -> dict[str, Any]:
    """The body verl's ``call_sandbox_api`` posts for one case."""
    return {"compile_timeout": timeout, "run_timeout": timeout, "code": code, "stdin": stdin,
            "memory_limit_MB": 1024, "language": language, "files": {}, "fetch_files": []}


Sample = tuple[float, bool, dict[str, float]]
"""(seconds, judged right, the gateway's time split of it: empty for the baseline)."""


def judge(url: str, program: Program, language: str,
          pool: concurrent.futures.ThreadPoolExecutor) -> list[Sample]:
    """All cases of one program at once; one :data:`Sample` per case."""
    code, cases = program

    def one(case: tuple[str, str]) -> Sample:
        started = time.perf_counter()
        try:
            answer = run_code(url, verl_request(code, case[0], language), REQUEST_TIMEOUT_S)
        except OSError:
            return time.perf_counter() - started, False, {}
        took = time.perf_counter() - started
        run = answer.get("run_result") or {}
        right = answer.get("status") == "Success" and \
            str(run.get("stdout", "")).rstrip("\n") == case[1].rstrip("\n")
        split = dict(answer.get(SPLIT_KEY) or {})
        if split:
            split["client"] = max(took - sum(split.values()), 0.0)
        return took, right, split

    return list(pool.map(one, cases))


def measure(url: str, system: str, clients: int, programs: Sequence[Program], language: str,
            total_programs: int) -> Point:
    """``clients`` clients judging ``total_programs`` programs between them."""
    per_client = [[programs[(c + k * clients) % len(programs)]
                   for k in range(-(-total_programs // clients))] for c in range(clients)]
    cases = max(len(p[1]) for p in programs)
    samples: list[Sample] = []
    with concurrent.futures.ThreadPoolExecutor(clients * cases) as case_pool, \
            concurrent.futures.ThreadPoolExecutor(clients) as client_pool:
        def client(mine: list[Program]) -> list[Sample]:
            return [s for p in mine for s in judge(url, p, language, case_pool)]

        started = time.perf_counter()
        for found in client_pool.map(client, per_client):
            samples += found
        elapsed = time.perf_counter() - started
    latencies = sorted(s for s, _, _ in samples)
    splits = [split for _, _, split in samples if split]
    mean = {part: 1000 * statistics.fmean(s[part] for s in splits)
            for part in SPLIT_PARTS} if splits else None
    return Point(system, clients, len(samples), statistics.median(latencies) * 1000,
                 _quantile(latencies, 0.9) * 1000, len(samples) / elapsed,
                 sum(ok for _, ok, _ in samples) / len(samples), mean)


def ratios(points: Sequence[Point]) -> dict[int, dict[str, float]]:
    """Per client count: tangram's throughput, p50 and p90 over the baseline's, and its
    correct answers per second over the baseline's (inf when the baseline judged none right:
    under load its compiles and runs reach their time-outs)."""
    found: dict[int, dict[str, float]] = {}
    for clients in sorted({p.clients for p in points}):
        by = {p.system: p for p in points if p.clients == clients}
        if {"tangram", "baseline"} <= set(by):
            tangram, base = by["tangram"], by["baseline"]
            right = base.throughput_rps * base.correct
            found[clients] = {"throughput": tangram.throughput_rps / base.throughput_rps,
                              "p90": tangram.p90_ms / base.p90_ms,
                              "p50": tangram.p50_ms / base.p50_ms,
                              "correct_throughput": tangram.throughput_rps * tangram.correct
                              / right if right else math.inf}
    return found


def render(points: Sequence[Point], language: str, cases: int) -> str:
    """The table and the ratios, as printed."""
    lines = [f"tangram bench gateway: verl-style {language} load, {cases} cases per program, "
             "one request per case, all cases at once",
             f"{'system':<9} {'clients':>7} {'requests':>8} {'p50 ms':>8} {'p90 ms':>8} "
             f"{'req/s':>7} {'correct':>7}"]
    for p in points:
        lines.append(f"{p.system:<9} {p.clients:>7} {p.requests:>8} {p.p50_ms:>8.1f} "
                     f"{p.p90_ms:>8.1f} {p.throughput_rps:>7.1f} {p.correct:>7.0%}")
    split = [p for p in points if p.split_ms]
    for p in split:
        if p.split_ms and p.clients == min(q.clients for q in split):
            lines.append(f"{p.system} at {p.clients} client(s), mean ms per request: " + ", ".join(
                f"{part} {p.split_ms[part]:.1f}" for part in SPLIT_PARTS))
    for clients, ratio in ratios(points).items():
        lines.append(f"{clients:>3} clients: throughput {ratio['throughput']:.2f}x the "
                     f"baseline's, p50 {ratio['p50']:.2f}x, p90 {ratio['p90']:.2f}x, "
                     f"correct answers per second {_times(ratio['correct_throughput'])}")
    return "\n".join(lines)


def _times(ratio: float) -> str:
    return "baseline judged none right" if math.isinf(ratio) else f"{ratio:.2f}x"


TARGETS = "throughput >= 2x the baseline's and p90 <= 1x at the most clients; p50 <= 1x at one"


def section_text(points: Sequence[Point], language: str, cases: int, command: str,
                 machine: str) -> str:
    """The Markdown section ``gateway-<language>``: every point, tangram's ratios and, at the
    fewest clients, where a tangram request's time went."""
    lines = [f"## gateway-{language}", "", f"Command: `{command}`", "",
             f"verl-style {language} load on {machine}: {cases} cases per program, one request "
             "per case, all cases of a program at once, against the subprocess-per-request "
             "baseline (no isolation, no queue); one run, the two systems alternating at each "
             "client count, so the ratios hold better than the absolute milliseconds. "
             f"Targets: {TARGETS}.", "",
             "| system | clients | requests | p50 ms | p90 ms | req/s | judged right |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {p.system} | {p.clients} | {p.requests} | {p.p50_ms:.1f} | {p.p90_ms:.1f} "
              f"| {p.throughput_rps:.1f} | {p.correct:.0%} |" for p in points]
    lines += ["", "| clients | throughput, tangram / baseline | p50 | p90 "
              "| correct answers per second |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {clients} | {r['throughput']:.2f}x | {r['p50']:.2f}x | {r['p90']:.2f}x "
              f"| {_times(r['correct_throughput'])} |" for clients, r in ratios(points).items()]
    split = sorted((p.clients, p.split_ms) for p in points
                   if p.split_ms and p.system == "tangram")
    if split:
        clients, parts = split[0]
        lines += ["", f"Where a tangram request's time went at {clients} client(s) (mean ms, "
                  "from `X-Tangram-Timings`): "
                  + ", ".join(f"{part} {parts[part]:.1f}" for part in SPLIT_PARTS) + "."]
    return "\n".join(lines)


@contextlib.contextmanager
def tangram_gateway(cores: int, log_dir: Path) -> Iterator[str]:
    """A private Redis, one CPU node worker with ``cores`` cores and a gateway; its URL."""
    with embedded_redis() as server:
        settings = Settings.from_env({}, redis_url=server.url)
        with local_cluster(settings, DemoConfig(nodes=1, cores_per_node=cores), log_dir) as live:
            port = free_port()
            process = spawn_gateway({"TANGRAM_REDIS_URL": live.broker.redis_url}, port,
                                    log_dir / "gateway.log")
            try:
                yield wait_for_gateway(port, process)
            finally:
                stop_process(process)


def build_parser() -> argparse.ArgumentParser:
    """The arguments of ``tangram bench gateway``."""
    parser = argparse.ArgumentParser(prog="tangram bench gateway", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="1,8,32", help="client counts (default 1,8,32)")
    parser.add_argument("--cases", type=int, default=4, help="test cases per program (4)")
    parser.add_argument("--programs", type=int, default=0,
                        help="programs judged per client count (default max(12, 2 x clients))")
    parser.add_argument("--language", choices=("python", "cpp"), default="python")
    parser.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)),
                        help="cores of tangram's CPU node (default: this machine's)")
    parser.add_argument("--json", action="store_true", help="also print the points as JSON")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write the section DIR/bench/gateway-<language>.md")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run both systems at every client count and print the table."""
    args = build_parser().parse_args(argv)
    try:
        counts = [int(c) for c in args.clients.split(",") if c.strip()]
    except ValueError:
        print("tangram bench gateway: error: --clients takes counts like 1,8,32", file=sys.stderr)
        return 2
    if not counts or min(counts) < 1 or args.cases < 1:
        print("tangram bench gateway: error: client and case counts must be >= 1",
              file=sys.stderr)
        return 2
    make: Callable[[int], list[Program]] = \
        python_programs if args.language == "python" else cpp_programs
    programs = make(args.cases)
    points: list[Point] = []
    with tempfile.TemporaryDirectory(prefix="tangram-bench-gateway-") as logs, \
            start_baseline() as baseline, tangram_gateway(args.cores, Path(logs)) as gateway:
        urls = {"baseline": baseline.url, "tangram": gateway}
        for url in urls.values():
            measure(url, "warm-up", 2, programs, args.language, 4)
        for clients in counts:
            total = args.programs or max(12, 2 * clients)
            for system, url in urls.items():
                points.append(measure(url, system, clients, programs, args.language, total))
                print(f"  {system} at {clients} clients done", file=sys.stderr, flush=True)
    print(render(points, args.language, args.cases))
    found = {"points": [asdict(p) for p in points],
             "ratios": {str(k): v for k, v in ratios(points).items()}}
    if args.json:
        print(json.dumps(found, indent=2))
    if args.out is not None:
        given = list(sys.argv[1:] if argv is None else argv)
        text = section_text(points, args.language, args.cases,
                            "tangram bench gateway " + shlex.join(given),
                            f"a shared {os.cpu_count()}-core machine, "
                            f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d}")
        folder = args.out / "bench"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"gateway-{args.language}.json").write_text(json.dumps(found, indent=1))
        publish(args.out, f"gateway-{args.language}", text)
    return 0


def _quantile(ordered: Sequence[float], q: float) -> float:
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


if __name__ == "__main__":
    sys.exit(main())
