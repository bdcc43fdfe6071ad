"""ACT of a burst of reward actions through the whole GPU path: elastic DoP against fixed DoP 1.

Both runs use the same real tritonserver and model, a real Redis and a real GPU pool worker
(one per run, same pool size). A burst of ``--actions`` reward actions, each scoring ``--rows``
(response, reference) pairs, is submitted at once through the client, twice per run: **cold**
(services not loaded yet) and **warm**. The elastic run's actions ask for ``{"set": [1, 2, 4, 8]}``
GPUs with a declared T1 and Amdahl elasticity; the fixed run's ask for 1 GPU.

**On a machine without GPUs the GPU ids are simulated**: a service on k simulated GPUs is k CPU
instances of the model, and one action's request runs on one instance, so more GPUs do not make
an action faster here; what the elastic run shows on such a machine is the cost of its decisions
(more distinct services to load), not the speed-up real GPUs would give.

``--batching`` compares instead cross-request batching at the pool level: the same burst of
1-GPU actions (default 32 of one row each on a 1-GPU pool, ``--actions``/``--rows``/``--gpus``)
through a pool worker that lets actions join a running batch of their service and through one
started with ``--no-batching``, same server, side by side, with the throughput ratio (warm).

Run: ``python -m tangram_bench.gpu [--batching]`` (uses ``TANGRAM_REDIS_URL`` if it
answers, else an embedded Redis; always starts its own tritonserver on free ports).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tangram_bench.reward import percentile
from tangram_celery.action import Action, ActionResult
from tangram_celery.client import TangramClient
from tangram_celery.pools.gpu_pool import reward_action, worker_name
from tangram_celery.pools.launch import spawn_gpu_worker, wait_for_worker
from tangram_celery.processes import stop_process
from tangram_celery.reward.executor import default_repository
from tangram_celery.reward.server import TritonServer
from tangram_celery.settings import Settings
from tangram_celery.stack.broker import ensure_redis

PAIRS = [("The answer is \\boxed{\\frac{1}{2}}", "0.5"), ("#### 72", "72"), ("41", "42")]
ELASTIC_COST = {"set": [1, 2, 4, 8]}


@dataclass(frozen=True)
class Burst:
    """The figures of one burst (seconds)."""

    mode: str
    round: str
    actions: int
    act_mean: float
    act_p50: float
    act_p90: float
    queue_mean: float
    exec_mean: float
    overhead_mean: float
    makespan: float
    gpus_mean: float
    loads: int
    joined: int = 0

    @property
    def throughput(self) -> float:
        """Actions per second over the burst's makespan."""
        return self.actions / self.makespan if self.makespan > 0 else 0.0


def summarize(mode: str, label: str, results: Sequence[ActionResult]) -> Burst:
    """One burst's ACT figures; raises if an action did not succeed."""
    failed = [r for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} reward actions failed: {failed[0].error}")
    acts = [r.act for r in results]
    totals = [a["total"] for a in acts]
    return Burst(
        mode=mode,
        round=label,
        actions=len(results),
        act_mean=statistics.fmean(totals),
        act_p50=percentile(totals, 0.5),
        act_p90=percentile(totals, 0.9),
        queue_mean=statistics.fmean(a["queue"] for a in acts),
        exec_mean=statistics.fmean(a["exec"] for a in acts),
        overhead_mean=statistics.fmean(a["overhead"] for a in acts),
        makespan=max(r.timings.completed for r in results)
        - min(r.timings.submitted for r in results),
        gpus_mean=statistics.fmean(len(r.units) for r in results),
        loads=sum(bool(r.output.get("loaded")) for r in results),
        joined=sum(bool(r.output.get("joined")) for r in results),
    )


def burst(pool: str, mode: str, count: int, rows: int, model: str) -> list[Action]:
    """``count`` reward actions of ``rows`` pairs each for ``pool``."""
    picked = [PAIRS[k % len(PAIRS)] for k in range(rows)]
    inputs = {"response": [p[0] for p in picked], "reference": [p[1] for p in picked]}
    fields: dict[str, Any] = {"gpu": 1}
    if mode == "elastic":
        fields = {"gpu": ELASTIC_COST, "t1": 0.05, "elasticity": {"amdahl": 0.9}}
    return [reward_action(f"bench-{k}", model, inputs, pool=pool, signature=f"bench-{mode}",
                          **fields) for k in range(count)]


WORKER_ARGS = {"batched": ("--concurrency", "{n}"),
               "unbatched": ("--concurrency", "{n}", "--no-batching")}
"""Extra pool worker arguments per mode (``{n}``: the burst size)."""


def run_mode(
    settings: Settings, env: dict[str, str], mode: str, args: argparse.Namespace, logs: Path
) -> list[Burst]:
    """Start a pool worker, send a cold then a warm burst, stop the worker."""
    pool = f"bench-{mode}-{os.getpid()}"
    extra = [a.format(n=max(args.actions, 1)) for a in WORKER_ARGS.get(mode, ())]
    process = spawn_gpu_worker(env, pool, args.gpus, logs / f"{pool}.log", extra)
    figures = []
    try:
        with TangramClient(settings) as client:
            wait_for_worker(client.app, worker_name(pool, process.pid), process)
            for label in ("cold", "warm"):
                actions = burst(pool, mode, args.actions, args.rows, args.model)
                results = client.run_batch(actions, timeout=args.timeout)
                figures.append(summarize(mode, label, results))
    finally:
        stop_process(process, timeout=30)
    return figures


def render(figures: Sequence[Burst], gpus: int) -> str:
    """The printed table."""
    lines = [
        f"reward bursts on a GPU pool of {gpus} SIMULATED GPUs (no GPU here), real tritonserver",
        f"{'mode':8} {'round':5} {'n':>3} {'ACT mean':>9} {'p50':>7} {'p90':>7} {'queue':>7} "
        f"{'exec':>7} {'overhead':>8} {'makespan':>8} {'GPUs':>5} {'loads':>5}",
    ]
    for b in figures:
        lines.append(
            f"{b.mode:8} {b.round:5} {b.actions:3d} {b.act_mean:9.3f} {b.act_p50:7.3f} "
            f"{b.act_p90:7.3f} {b.queue_mean:7.3f} {b.exec_mean:7.4f} {b.overhead_mean:8.3f} "
            f"{b.makespan:8.3f} {b.gpus_mean:5.2f} {b.loads:5d}"
        )
    return "\n".join(lines)


def render_batching(figures: Sequence[Burst], gpus: int) -> str:
    """The printed side-by-side of batched and unbatched bursts, with the throughput ratio."""
    lines = [
        f"pool-level batching: bursts on a GPU pool of {gpus} SIMULATED GPUs, real tritonserver",
        f"{'mode':9} {'round':5} {'n':>3} {'joined':>6} {'ACT mean':>9} {'p90':>7} "
        f"{'makespan':>8} {'actions/s':>9}",
    ]
    for b in figures:
        lines.append(f"{b.mode:9} {b.round:5} {b.actions:3d} {b.joined:6d} {b.act_mean:9.3f} "
                     f"{b.act_p90:7.3f} {b.makespan:8.3f} {b.throughput:9.1f}")
    warm = {b.mode: b for b in figures if b.round == "warm"}
    if "batched" in warm and "unbatched" in warm and warm["unbatched"].throughput > 0:
        ratio = warm["batched"].throughput / warm["unbatched"].throughput
        lines.append(f"warm throughput ratio batched/unbatched: {ratio:.2f}x")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run both modes, print the table (or JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batching", action="store_true",
                        help="compare pool-level batching with --no-batching instead")
    parser.add_argument("--actions", type=int, default=None,
                        help="actions per burst (default 24; 32 with --batching)")
    parser.add_argument("--rows", type=int, default=None,
                        help="pairs scored per action (default 16; 1 with --batching)")
    parser.add_argument("--gpus", type=int, default=None,
                        help="GPUs of the pool, simulated (default 8; 1 with --batching)")
    parser.add_argument("--model", default="answer_match")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    defaults = (32, 1, 1) if args.batching else (24, 16, 8)
    for name, default in zip(("actions", "rows", "gpus"), defaults, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, default)
    modes = ("batched", "unbatched") if args.batching else ("elastic", "fixed")
    base = Settings.from_env()
    with (
        ensure_redis(base.broker.redis_url) as redis_url,
        tempfile.TemporaryDirectory(prefix="tangram-bench-gpu-") as scratch,
        TritonServer(default_repository(), workdir=Path(scratch)) as server,
    ):
        settings = base.with_(redis_url=redis_url)
        env = {"TANGRAM_REDIS_URL": redis_url, "TANGRAM_TRITON_URL": server.http_url,
               "TANGRAM_TRITON_REPOSITORY": str(default_repository()),
               "TANGRAM_GPU_SIMULATED": "true"}
        figures = [b for mode in modes
                   for b in run_mode(settings, env, mode, args, Path(scratch))]
    if args.json:
        print(json.dumps([asdict(b) for b in figures], indent=2))
    elif args.batching:
        print(render_batching(figures, args.gpus))
    else:
        print(render(figures, args.gpus))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
