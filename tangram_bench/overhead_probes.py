"""The measurements of ``tangram bench overhead``, one function per thing measured.

Sandbox-level probes call a backend directly (no Celery): a warm action in a live trajectory
(``true`` and a Python ``print(1)``), the first action of a fresh trajectory (cold start), and
the same warm action on the Docker backend. Request-level probes go through the whole system
(client, Redis, the node worker) or through the baseline's HTTP server, one at a time or with
32 in flight.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tangram_bench.baseline import run_code
from tangram_celery.client import TangramClient, code_action
from tangram_celery.sandbox import ExecSpec, SandboxBackend

PRINT_CODE = "print(1)"
CPU_CODE = "s = 0\nfor i in range(N):\n    s += i * i\nprint(s > 0)\n"
CPU_TARGET_S = 0.19
SANDBOX_PYTHON = "/usr/bin/python3"
LANE_MEMORY_MB = 128.0
"""Each benchmark trajectory's memory, so 33 of them fit on the benchmark's node (8 GiB)."""


@dataclass
class Samples:
    """Named lists of seconds (latencies) or rates, gathered over interleaved rounds."""

    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, more: Sequence[float]) -> None:
        """Append ``more`` to the list called ``name``."""
        self.values.setdefault(name, []).extend(more)


def timed(call: Callable[[], object], n: int) -> list[float]:
    """Wall seconds of ``n`` sequential calls."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        out.append(time.perf_counter() - t0)
    return out


def _checked(backend: SandboxBackend, spec: ExecSpec) -> None:
    outcome = backend.run(spec)
    if outcome.exit_code != 0:
        raise SystemExit(f"{backend.name} sandbox run failed: {outcome.stderr.strip()}")


FLOOR_CODE = """
import json, os, sys, time
out = []
for _ in range(int(sys.argv[1])):
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.execv("/bin/sh", ["/bin/sh", "-c", "true"])
    os.waitpid(pid, 0)
    out.append(time.perf_counter() - t0)
print(json.dumps(out))
"""


def fork_exec_floor(n: int) -> list[float]:
    """This machine's floor for any warm action: ``n`` forks, each an exec of
    ``/bin/sh -c true`` and a wait, from a small stdlib Python process like the executor (no
    sandbox, no pipes, no cgroup)."""
    done = subprocess.run([SANDBOX_PYTHON, "-I", "-S", "-c", FLOOR_CODE, str(n)],
                          capture_output=True, text=True, timeout=120, check=True)
    return [float(x) for x in json.loads(done.stdout)]


def warm_true(backend: SandboxBackend, trajectory_id: str, core: int) -> Callable[[], None]:
    """``true`` in an existing trajectory."""
    spec = ExecSpec(trajectory_id, "true", {}, 30.0, (core,))
    return lambda: _checked(backend, spec)


def warm_print(backend: SandboxBackend, trajectory_id: str, core: int) -> Callable[[], None]:
    """A Python ``print(1)`` code action (its file written, then run) in an existing
    trajectory."""
    spec = ExecSpec(trajectory_id, f"{SANDBOX_PYTHON} p.py", {"p.py": PRINT_CODE}, 30.0,
                    (core,), python="p.py")
    return lambda: _checked(backend, spec)


def cold_starts(backend: SandboxBackend, n: int, core: int, prefix: str) -> list[float]:
    """``true`` as the first action of ``n`` fresh trajectories (each ended, untimed)."""
    out = []
    for i in range(n):
        trajectory_id = f"{prefix}-{i}-{os.urandom(3).hex()}"
        spec = ExecSpec(trajectory_id, "true", {}, 30.0, (core,))
        t0 = time.perf_counter()
        _checked(backend, spec)
        out.append(time.perf_counter() - t0)
        backend.end_trajectory(trajectory_id)
    return out


def tangram_print(client: TangramClient, trajectory_id: str) -> Callable[[], None]:
    """One ``print(1)`` code action through the whole system, waited for."""
    def call() -> None:
        result = client.submit(code_action(trajectory_id, PRINT_CODE,
                                               trajectory_memory_mb=LANE_MEMORY_MB)).result(60)
        if result.status != "ok":
            raise SystemExit(f"tangram print(1) failed: {result.error or result.output}")
    return call


def baseline_print(url: str) -> Callable[[], None]:
    """One ``print(1)`` request to the baseline server."""
    def call() -> None:
        answer = run_code(url, {"code": PRINT_CODE, "language": "python"}, 60.0)
        if answer.get("status") != "Success":
            raise SystemExit(f"baseline print(1) failed: {answer}")
    return call


def inflight_rate(calls: Sequence[Callable[[], None]], per_lane: int) -> float:
    """Requests per second with ``len(calls)`` lanes in flight, each making ``per_lane`` calls."""
    errors: list[BaseException] = []

    def lane(call: Callable[[], None]) -> None:
        try:
            for _ in range(per_lane):
                call()
        except BaseException as exc:  # noqa: BLE001 # re-raised below, in the caller
            errors.append(exc)

    threads = [threading.Thread(target=lane, args=(c,), daemon=True) for c in calls]
    t0 = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return len(calls) * per_lane / elapsed


def cpu_snippet(iterations: int) -> str:
    """The CPU-bound snippet with its loop count."""
    return CPU_CODE.replace("N", str(iterations))


def calibrate_cpu(target_s: float = CPU_TARGET_S) -> tuple[int, float]:
    """A loop count whose snippet runs about ``target_s`` alone, and its time alone (median of
    5 runs in the sandbox's python, measured by the snippet around its own loop)."""
    probe = ("import time\nt = time.perf_counter()\n" + cpu_snippet(2_000_000)
             + "print(time.perf_counter() - t)\n")
    first = _self_timed(probe)
    iterations = max(int(2_000_000 * target_s / first), 1000)
    timed_probe = ("import time\nt = time.perf_counter()\n" + cpu_snippet(iterations)
                   + "print(time.perf_counter() - t)\n")
    alone = sorted(_self_timed(timed_probe) for _ in range(5))[2]
    return iterations, alone


def _self_timed(code: str) -> float:
    done = subprocess.run([SANDBOX_PYTHON, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    return float(done.stdout.split()[-1])


def tangram_cpu(client: TangramClient, trajectory_id: str, iterations: int
                ) -> Callable[[], None]:
    """One CPU-bound snippet through the whole system, waited for."""
    code = cpu_snippet(iterations)

    def call() -> None:
        result = client.submit(code_action(trajectory_id, code,
                                               trajectory_memory_mb=LANE_MEMORY_MB)).result(300)
        if result.status != "ok":
            raise SystemExit(f"tangram cpu snippet failed: {result.error or result.output}")
    return call


def describe(values: dict[str, Any]) -> dict[str, Any]:
    """Round the floats of a report for printing."""
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in values.items()}
