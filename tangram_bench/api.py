"""Traffic control of a rate-limited API: trajectories calling it themselves vs. tangram's basic
manager, on the same DeepSearch-like workload, side by side.

    python -m tangram_bench.api [--trajectories 40] [--steps 4] [--json]

A local HTTP API (:mod:`tangram_bench.ratelimited`) allows ``--rate`` calls per second
(bucket of the same size) and ``--api-concurrency`` calls in flight, answers 429 past either, and
shares one backend among the calls in flight, so overlapping calls all slow down. Each of
``--trajectories`` trajectories alternates LLM "thinking" (a seeded random pause, the same in both
runs) and a search call, ``--steps`` times. Rollouts of one batch think about as long as each
other, so their calls come in waves: larger than the API's burst, while the average demand stays
below its quota.

* **(a) direct**: every trajectory calls the API itself; on a 429 it retries up to 3 times with
  exponential backoff and jitter, then gives up (a failed action);
* **(b) tangram**: every call is an ``api`` action submitted through ``TangramClient`` and run by
  ``--workers`` real API pool workers (subprocesses) under the basic manager, declared with the
  API's rate and ``--concurrency`` calls in flight (the backend's sweet spot, default 4), served
  oldest trajectory first (``TANGRAM_API_BYPASS_S``, default 60 s);
* **(c) tangram FCFS**: the same with ``TANGRAM_API_BYPASS_S=0``, plain FCFS by arrival (the
  paper's order), to show what the order does on the real stack.

Reported for each: HTTP 429s (counted by the API itself), failed actions, average and p99 ACT
(from the moment the trajectory wants the answer until it has it, failed actions included),
makespan, the most calls the API saw in flight, and (a)/(b) and (c)/(b) ratios. Where the
difference comes from: (a) loses time in backoff sleeps while quota is free, in calls slowed down
by a crowded backend, and in failures; (b) and (c) queue each wave and feed the API exactly what
it allows; (b) lets the trajectories that started first go first, so they finish sooner.
Under sustained overload (demand above the quota) (a) sheds load by giving up, which caps its
ACT, while (b) completes every action, so compare failures and p99 too. Uses the Redis at
``TANGRAM_REDIS_URL`` if one answers, else an embedded one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from celery import Celery

from tangram_bench.ratelimited import RateLimitedService, ServiceLimits
from tangram_celery import keys
from tangram_celery.client import TangramClient
from tangram_celery.connection import connect
from tangram_celery.pools.api_pool import (
    api_action,
    http_call,
    spawn_api_worker,
    wait_for_worker,
    worker_name,
)
from tangram_celery.processes import stop_process
from tangram_celery.settings import Settings
from tangram_celery.stack.broker import ensure_redis
from tangram_celery.tasks.app import make_app

API = "bench-search"
SEARCH_PATH = "/search"
CALL_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Workload:
    """The DeepSearch-like batch: trajectories x steps, think time between calls."""

    trajectories: int = 40
    steps: int = 4
    think_s: tuple[float, float] = (1.8, 2.0)
    retries: int = 3
    backoff_s: float = 0.1
    seed: int = 7


@dataclass
class RunReport:
    """What one way of calling the API produced."""

    mode: str
    acts: list[float] = field(default_factory=list)
    failed: int = 0
    http_429: int = 0
    makespan_s: float = 0.0
    max_in_flight: int = 0

    @property
    def average_act_s(self) -> float:
        """Mean ACT over every action, failed ones included."""
        return statistics.fmean(self.acts) if self.acts else 0.0

    @property
    def p99_act_s(self) -> float:
        """99th percentile ACT (nearest rank)."""
        ordered = sorted(self.acts)
        return ordered[min(int(0.99 * len(ordered)), len(ordered) - 1)] if ordered else 0.0

    def summary(self) -> dict[str, Any]:
        """The figures as JSON-ready data."""
        return {"mode": self.mode, "actions": len(self.acts), "http_429": self.http_429,
                "failed": self.failed, "average_act_s": self.average_act_s,
                "p99_act_s": self.p99_act_s, "makespan_s": self.makespan_s,
                "max_in_flight": self.max_in_flight}


def think_times(workload: Workload) -> list[list[float]]:
    """Seeded think time of every (trajectory, step): identical in both runs."""
    rng = random.Random(workload.seed)
    low, high = workload.think_s
    return [[rng.uniform(low, high) for _ in range(workload.steps)]
            for _ in range(workload.trajectories)]


def backoff(attempt: int, base_s: float, rng: random.Random) -> float:
    """Exponential backoff with jitter before retry ``attempt`` (0-based)."""
    return base_s * 2.0 ** attempt * rng.uniform(0.5, 1.5)


def query(trajectory: int, step: int) -> dict[str, str]:
    """The search query of one step."""
    return {"q": f"trajectory {trajectory} step {step}"}


# --------------------------------------------------------------------------- (a) direct


def run_direct(service: RateLimitedService, workload: Workload) -> RunReport:
    """Every trajectory calls the API itself, retrying 429s with backoff (threads)."""
    report = RunReport("direct")
    lock = threading.Lock()
    thinks = think_times(workload)
    before = service.stats()

    def trajectory(index: int) -> None:
        rng = random.Random(workload.seed * 1000 + index)
        for step, pause in enumerate(thinks[index]):
            time.sleep(pause)
            started = time.monotonic()
            ok = _call_with_retries(service.url, query(index, step), workload, rng)
            with lock:
                report.acts.append(time.monotonic() - started)
                report.failed += 0 if ok else 1

    start = time.monotonic()
    threads = [threading.Thread(target=trajectory, args=(i,), daemon=True)
               for i in range(workload.trajectories)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    report.makespan_s = time.monotonic() - start
    _count_service(report, service, before)
    return report


def _call_with_retries(base_url: str, params: dict[str, str], workload: Workload,
                       rng: random.Random) -> bool:
    url = f"{base_url}{SEARCH_PATH}?{urlencode(params)}"
    for attempt in range(workload.retries + 1):
        try:
            reply = http_call(url, timeout_s=CALL_TIMEOUT_S)
        except OSError:
            return False
        if reply.status == 200:
            return True
        if reply.status != 429 or attempt == workload.retries:
            return False
        time.sleep(backoff(attempt, workload.backoff_s, rng))
    return False


# --------------------------------------------------------------------------- (b) tangram


def run_tangram(settings: Settings, service: RateLimitedService, workload: Workload,
                mode: str = "tangram") -> RunReport:
    """Every call is an ``api`` action through the client, run by the API pool workers."""
    report = RunReport(mode)
    thinks = think_times(workload)
    before = service.stats()
    run_id = uuid.uuid4().hex[:8]  # fresh trajectories: no place in the order from earlier runs

    async def trajectory(client: TangramClient, index: int) -> None:
        for step, pause in enumerate(thinks[index]):
            await asyncio.sleep(pause)
            action = api_action(f"deepsearch-{run_id}-{index}", API, SEARCH_PATH,
                                params=query(index, step), timeout_s=CALL_TIMEOUT_S)
            result = await client.submit(action).aresult(timeout=300)
            report.acts.append(result.act["total"])
            report.failed += 0 if result.ok else 1

    async def all_trajectories(client: TangramClient) -> None:
        await asyncio.gather(*(trajectory(client, i) for i in range(workload.trajectories)))

    with TangramClient(settings) as client:
        start = time.monotonic()
        asyncio.run(all_trajectories(client))
        report.makespan_s = time.monotonic() - start
    _count_service(report, service, before)
    return report


@contextlib.contextmanager
def api_workers(settings: Settings, count: int, logs: Path) -> Iterator[Celery]:
    """``count`` real API pool worker subprocesses for the bench API; stopped on exit."""
    env = {"TANGRAM_REDIS_URL": settings.broker.redis_url,
           "TANGRAM_API_LIMITS": settings.api.limits,
           "TANGRAM_API_BYPASS_S": repr(settings.api.bypass_s)}
    logs.mkdir(parents=True, exist_ok=True)
    processes = [spawn_api_worker(env, API, log_path=logs / f"api-{k}.log") for k in range(count)]
    app = make_app(settings)
    try:
        for process in processes:
            wait_for_worker(app, worker_name(API, process.pid), process)
        yield app
    finally:
        for process in processes:
            stop_process(process)


def reset_api_state(settings: Settings) -> None:
    """Forget the bench API's buckets, leases, tickets and queued messages from earlier runs."""
    client = connect(settings.broker)
    try:
        client.delete(keys.api_tokens(API), keys.api_leases(API), keys.api_tickets(API),
                      keys.api_ticket_deadlines(API), keys.api_queue(API))
    finally:
        client.close()


def _count_service(report: RunReport, service: RateLimitedService, before: Any) -> None:
    after = service.stats()
    report.http_429 = after.rejected - before.rejected
    report.max_in_flight = after.max_in_flight


# --------------------------------------------------------------------------- report


def ratio(a: float, b: float) -> str:
    """``a / b`` as text (``inf`` when only ``b`` is zero, ``-`` when both are)."""
    if b == 0:
        return "-" if a == 0 else "inf"
    return f"{a / b:.2f}x"


def render(reports: Reports, workload: Workload, limits: ServiceLimits, concurrency: int,
           workers: int, bypass_s: float) -> str:
    """The side-by-side table."""
    figures = (
        ("HTTP 429s", "http_429", "{:d}"),
        ("failed actions", "failed", "{:d}"),
        ("average ACT (s)", "average_act_s", "{:.3f}"),
        ("p99 ACT (s)", "p99_act_s", "{:.3f}"),
        ("makespan (s)", "makespan_s", "{:.2f}"),
        ("max calls in flight", "max_in_flight", "{:d}"),
    )
    lines = [
        f"DeepSearch-like workload: {workload.trajectories} trajectories x {workload.steps} "
        f"searches ({workload.trajectories * workload.steps} actions), think "
        f"{workload.think_s[0]:g}-{workload.think_s[1]:g} s",
        f"API: {limits.rate_per_s:g} calls/s (burst {limits.burst}), {limits.concurrency} in "
        f"flight, latency {limits.base_s * 1000:g} ms + {limits.work_s * 1000:g} ms x calls in "
        "flight (shared backend); 429 past a limit",
        f"(a) each trajectory calls it, up to {workload.retries} retries, backoff "
        f"{workload.backoff_s:g} s x 2^k with jitter; (b) api actions via {workers} API pool "
        f"worker(s), declared concurrency:{concurrency},rate:{round(limits.rate_per_s)}/1s, "
        f"oldest trajectory first (bypass {bypass_s:g} s); (c) the same, FCFS by arrival",
        f"{'':<22}{'(a) direct+retries':>20}{'(b) tangram':>14}{'(c) FCFS':>10}"
        f"{'(a)/(b)':>10}{'(c)/(b)':>10}",
    ]
    for name, attribute, fmt in figures:
        a, b, c = (getattr(report, attribute) for report in reports)
        lines.append(f"{name:<22}{fmt.format(a):>20}{fmt.format(b):>14}{fmt.format(c):>10}"
                     f"{ratio(a, b):>10}{ratio(c, b):>10}")
    return "\n".join(lines)


Reports = tuple[RunReport, RunReport, RunReport]
"""(a) direct, (b) tangram, (c) tangram FCFS."""


def run(settings: Settings, workload: Workload, limits: ServiceLimits, concurrency: int,
        workers: int = 2) -> Reports:
    """Run (a), (b) with ``settings.api.bypass_s``, then (c) FCFS, each against a fresh service
    with the same limits; returns the three reports."""
    with tempfile.TemporaryDirectory(prefix="tangram-bench-api-") as logs, \
            ensure_redis(settings.broker.redis_url) as url:
        with RateLimitedService(limits) as service:
            direct = run_direct(service, workload)
        runs = []
        for mode, bypass_s in (("tangram", settings.api.bypass_s), ("tangram-fcfs", 0.0)):
            with RateLimitedService(limits) as service:
                declared = (f"{API}=url:{service.url},concurrency:{concurrency},"
                            f"rate:{round(limits.rate_per_s)}/1s,burst:{limits.burst}")
                live = settings.with_(redis_url=url, api_limits=declared, api_bypass_s=bypass_s)
                reset_api_state(live)
                with api_workers(live, workers, Path(logs) / mode):
                    runs.append(run_tangram(live, service, workload, mode))
    return direct, runs[0], runs[1]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison and print its table (and JSON with ``--json``)."""
    parser = argparse.ArgumentParser(prog="python -m tangram_bench.api")
    defaults, service_defaults = Workload(), ServiceLimits()
    parser.add_argument("--trajectories", type=int, default=defaults.trajectories)
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--rate", type=int, default=int(service_defaults.rate_per_s))
    parser.add_argument("--api-concurrency", type=int, default=service_defaults.concurrency,
                        help="calls in flight the API accepts before answering 429")
    parser.add_argument("--concurrency", type=int, default=4,
                        help="calls in flight tangram allows (the API's sweet spot)")
    parser.add_argument("--workers", type=int, default=2, help="API pool workers for (b)")
    parser.add_argument("--think", type=float, nargs=2, default=defaults.think_s,
                        metavar=("MIN_S", "MAX_S"), help="LLM think time between calls")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    workload = Workload(trajectories=args.trajectories, steps=args.steps,
                        think_s=(args.think[0], args.think[1]), seed=args.seed)
    limits = ServiceLimits(rate_per_s=args.rate, burst=args.rate,
                           concurrency=args.api_concurrency)
    settings = Settings.from_env()
    reports = run(settings, workload, limits, args.concurrency, args.workers)
    if args.json:
        print(json.dumps({"workload": asdict(workload), "limits": asdict(limits),
                          **{r.mode: r.summary() for r in reports}}, indent=2))
    print(render(reports, workload, limits, args.concurrency, args.workers,
                 settings.api.bypass_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
