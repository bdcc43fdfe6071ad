"""The real-stack ``celery`` system: the batch on a stock Celery worker (see
:mod:`.stock_app`), with no tangram scheduling, sandbox or client in its path.

The client is Celery's own ``send_task``; it learns each result from Celery's result backend,
reading the result keys of every pending action in one round trip every
:data:`POLL_S` (Celery's blocking ``get`` is not safe from many threads at once), so up to
:data:`POLL_S` of each action's overhead is the poll's. Commands run in a plain subprocess: no
isolation, which favours this baseline (tangram pays for its sandboxes in every figure).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from celery import Celery

from tangram_bench.elastic.actions import Step, steps_for
from tangram_bench.elastic.records import gather
from tangram_bench.elastic.stock_app import TASK, URL_VARIABLE, make_stock_app
from tangram_bench.sim.record import ActionRecord, RunResult
from tangram_bench.workloads import Workload
from tangram_bench.workloads.model import ActionSpec
from tangram_celery.processes import spawn_process, stop_process
from tangram_celery.settings import Settings
from tangram_celery.stack.broker import embedded_redis

POLL_S = 0.002
"""How often the client reads the pending results."""
READY_S = 60.0
"""How long the worker may take to start."""


class Results:
    """Pending Celery results, read together from the result backend."""

    def __init__(self, app: Celery) -> None:
        self._app = app
        self._redis = app.backend.client
        self._pending: dict[str, asyncio.Future[tuple[dict[str, Any], float]]] = {}

    def expect(self, task_id: str) -> asyncio.Future[tuple[dict[str, Any], float]]:
        """A future of the task's return value and the time it was seen."""
        future = asyncio.get_running_loop().create_future()
        self._pending[task_id] = future
        return future

    async def serve(self) -> None:
        """Resolve pending futures until cancelled."""
        while True:
            await asyncio.sleep(POLL_S)
            if self._pending:
                self._read()

    def _read(self) -> None:
        ids = list(self._pending)
        keys = [self._app.backend.get_key_for_task(task_id) for task_id in ids]
        replies = self._redis.mget(keys)
        seen = time.time()
        for task_id, raw in zip(ids, replies, strict=True):
            if raw is None:
                continue
            meta = json.loads(raw)
            future = self._pending.pop(task_id)
            if meta.get("status") == "SUCCESS":
                future.set_result((meta["result"], seen))
            elif meta.get("status") in ("FAILURE", "REVOKED"):
                future.set_exception(RuntimeError(f"stock task {task_id}: {meta.get('result')}"))
            else:
                self._pending[task_id] = future


async def _rollout(app: Celery, results: Results, queue: str, steps: list[Step],
                   done: Callable[[], None]) -> list[tuple[float, dict[str, Any], float]]:
    answers = []
    for step in steps:
        await asyncio.sleep(step.think_s)
        submitted = time.time()
        task_id = app.send_task(TASK, args=[step.action.payload["cmd"]], queue=queue).id
        answer, seen = await results.expect(task_id)
        answers.append((submitted, answer, seen))
        done()
    return answers


async def _run_batch(app: Celery, queue: str, batch: list[list[Step]],
                     tick: Callable[[int], None] | None
                     ) -> list[list[tuple[float, dict[str, Any], float]]]:
    results = Results(app)
    server = asyncio.create_task(results.serve())
    count = [0]

    def done() -> None:
        count[0] += 1
        if tick is not None:
            tick(count[0])

    try:
        return list(await asyncio.gather(
            *(_rollout(app, results, queue, steps, done) for steps in batch)))
    finally:
        server.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await server


def _wait_ready(app: Celery, queue: str) -> None:
    """Until the worker answers a no-op command (it is then consuming ``queue``)."""
    answer = app.send_task(TASK, args=["true"], queue=queue)
    answer.get(timeout=READY_S)
    answer.forget()


@contextlib.contextmanager
def stock_worker(url: str, queue: str, cores: int, logs: Path) -> Iterator[Celery]:
    """A stock prefork worker of ``cores`` processes on ``queue``; yields the client's app."""
    worker = spawn_process([sys.executable, "-m", "tangram_bench.elastic.stock_app", queue,
                            str(cores)], {URL_VARIABLE: url}, logs / "stock-worker.log")
    app = make_stock_app(url)
    try:
        _wait_ready(app, queue)
        yield app
    finally:
        stop_process(worker, timeout=30.0)
        app.close()


def record_of(answer: tuple[float, dict[str, Any], float], spec: ActionSpec, trajectory: str,
              index: int, origin: float) -> ActionRecord:
    """A stock task's timings as a benchmark record (times relative to ``origin``): queue to
    its start in a worker process, exec to its command's end, overhead to the client seeing
    it."""
    submitted, result, seen = answer
    started, finished = result["started"], result["finished"]
    if result["returncode"] != 0:
        raise RuntimeError(f"a stock task of {trajectory} exited {result['returncode']}")
    return ActionRecord(
        trajectory=trajectory, index=index, kind=spec.kind, pool="cpu", node="stock",
        units=1, submitted=submitted - origin, started=started - origin,
        finished=seen - origin, queue=started - submitted, exec=finished - started,
        overhead=seen - finished, held=finished - started, used=spec.t1)


def run_stock(workload: Workload, cores: int, point: dict[str, object],
              tick: Callable[[int], None] | None = None,
              settings: Settings | None = None) -> RunResult:
    """Run ``workload`` as the ``celery`` system: a stock Celery worker of ``cores`` processes
    on the Redis of ``settings``, or on a private embedded Redis without settings."""
    tag = f"celery-{int(time.time() * 1000) % 10**9}"
    batch = steps_for(workload, "celery", cores, tag)
    result = RunResult("celery", workload.name, point)
    with contextlib.ExitStack() as stack:
        if settings is None:
            url = stack.enter_context(embedded_redis()).url
        else:
            url = settings.broker.redis_url
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tangram-bench-")))
        app = stack.enter_context(stock_worker(url, f"stock-{tag}", cores, logs))
        origin = time.time()
        began = time.perf_counter()
        outcome = asyncio.run(_run_batch(app, f"stock-{tag}", batch, tick))
        result.wall_s = time.perf_counter() - began
    return gather(result, workload, [
        [record_of(answer, spec, trajectory.id, index, origin)
         for index, (spec, answer) in enumerate(zip(trajectory.actions, answers, strict=True))]
        for trajectory, answers in zip(workload.trajectories, outcome, strict=True)], cores)
