"""The stock Celery baseline's worker: an unmodified prefork Celery worker whose one task runs
an action's command in a plain subprocess, with no tangram code in its path.

    TANGRAM_BENCH_STOCK_URL=redis://... python -m tangram_bench.elastic.stock_app QUEUE CORES

Each task holds one worker process for as long as its command runs, so a worker of ``CORES``
processes runs at most ``CORES`` commands at once, in the order Celery hands them out. The
command sees ``TANGRAM_UNITS=1``: an emulated test run then takes its one-core time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

from celery import Celery

TASK = "stock.run"
"""The name of the one task."""
URL_VARIABLE = "TANGRAM_BENCH_STOCK_URL"
"""The environment variable that gives the worker its Redis URL (a password stays off argv)."""


def make_stock_app(broker_url: str) -> Celery:
    """A Celery app on ``broker_url`` (broker and result backend), JSON only, Celery's defaults
    otherwise, with the one task registered."""
    app = Celery("stock", broker=broker_url, backend=broker_url, set_as_current=False)
    app.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"],
                    worker_hijack_root_logger=False)
    app.task(name=TASK)(run_command)
    return app


def run_command(command: str) -> dict[str, Any]:
    """Run ``command`` with ``sh -c`` on one unit; its start and end on this host's clock and
    its exit status."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TANGRAM_UNITS": "1"}
    started = time.time()
    done = subprocess.run(["/bin/sh", "-c", command], env=env, capture_output=True, check=False)
    return {"started": started, "finished": time.time(), "returncode": done.returncode}


def main(argv: list[str]) -> None:
    """Run the worker: ``QUEUE CORES``, on the Redis of ``TANGRAM_BENCH_STOCK_URL``."""
    queue, cores = argv
    app = make_stock_app(os.environ[URL_VARIABLE])
    app.worker_main(["worker", "--pool", "prefork", "--concurrency", cores, "--queues", queue,
                     "--loglevel", "WARNING", "--without-gossip", "--without-mingle"])


if __name__ == "__main__":
    main(sys.argv[1:])
