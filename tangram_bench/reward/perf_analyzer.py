"""The bridge to NVIDIA's ``perf_analyzer``: the request pool as its input data, its throughput.

``--perf-analyzer PATH`` measures both variants with ``perf_analyzer`` at the same points, in the
same interleaved rounds, with the same request pool (``--input-data``) and protocol. The PyPI
``perf-analyzer`` package is an empty placeholder; the binary ships in the ``tritonclient``
manylinux wheels. In a separate virtual environment (never the project's)::

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

import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tangram_celery.reward.triton import Protocol

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
