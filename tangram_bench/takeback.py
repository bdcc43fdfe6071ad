"""How long a node takes to hand a core of a running malleable test run to another action, on
each sandbox backend this machine runs, in the order the node uses and in the earlier one.

    tangram bench takeback [--cycles 20] [--json] [--docker-url URL] [--out docs]

One real malleable pytest run per backend (the bubblewrap sandbox with cgroups, and a Docker
container of the sandbox image), 2 workers on 2 cores, its tests sleeping. Each cycle times one
take-back in each order, alternating, on the same run:

- ``take_first_s``: the node narrows the run's cpuset (the core is free from then on), and only
  then asks the run to retire a worker (untimed): :meth:`CoreResizer.take` then ``retire``;
- ``ask_first_s``: the node asks the run to retire a worker, and narrows the cpuset once it
  answered (the earlier order).

The core then goes back to the run (cpuset first, then ``grow``; untimed). Wall-clock figures
of this machine; the section gives each order's median and range over the cycles and their
ratio. A backend this machine cannot run, or that cannot re-pin a running action here, gets
a line that says why.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tangram_bench.report import publish
from tangram_celery.errors import SandboxError
from tangram_celery.pools.cpu_pool.resizing import run_control
from tangram_celery.sandbox import ExecSpec, SandboxBackend, SandboxLimits
from tangram_celery.sandbox.base import RunControl
from tangram_celery.sandbox.bwrap import BwrapBackend
from tangram_celery.sandbox.docker import DockerBackend
from tangram_celery.sandbox.malleable import malleable_command, runner_files
from tangram_celery.settings import Settings

NAME = "malleable-takeback"
RUNNER = ".tangram-runner"
SOCKET = "takeback.sock"
SUITE = (
    "import time, pytest\n"
    "@pytest.mark.parametrize('i', range(4000))\n"
    "def test_sleeps(i):\n"
    "    time.sleep(0.02)\n"
)
"""Enough single-core work (80 s) to outlast the cycles; the run is ended after them."""
COLUMNS = ("backend", "cycles", "take_first_s", "ask_first_s", "ratio")


def timed(step: Callable[[], object]) -> float:
    """Seconds ``step`` took."""
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def take_first(backend: SandboxBackend, tid: str, control: RunControl,
               two: tuple[int, ...], one: tuple[int, ...]) -> float:
    """The node's order: the cpuset narrows, then the run is asked; the first part timed."""
    seconds = timed(lambda: _repin(backend, tid, two, one))
    control("shrink", 10.0)
    return seconds


def ask_first(backend: SandboxBackend, tid: str, control: RunControl,
              two: tuple[int, ...], one: tuple[int, ...]) -> float:
    """The earlier order: the run is asked, then the cpuset narrows; both timed."""
    start = time.perf_counter()
    control("shrink", 10.0)
    _repin(backend, tid, two, one)
    return time.perf_counter() - start


def _repin(backend: SandboxBackend, tid: str, cores: tuple[int, ...],
           to: tuple[int, ...]) -> None:
    if not backend.repin(tid, cores, to):
        raise RuntimeError(f"the {backend.name} backend cannot re-pin a running action here")


def _give_back(backend: SandboxBackend, tid: str, control: RunControl,
               two: tuple[int, ...], one: tuple[int, ...]) -> None:
    _repin(backend, tid, one, two)
    control("grow", 10.0)


def measure(backend: SandboxBackend, cycles: int, two: tuple[int, int]) -> dict[str, Any]:
    """One backend's row: ``cycles`` take-backs in each order on one running run."""
    tid = f"takeback-{uuid.uuid4().hex[:8]}"
    one = two[:1]
    command = malleable_command("python3 -m pytest -q -p no:cacheprovider suite", 2,
                                control=f"/work/{SOCKET}")
    spec = ExecSpec(tid, command, {**runner_files(RUNNER), "suite/test_sleeps.py": SUITE},
                    300.0, two, env={"PYTHONPATH": f"/work/{RUNNER}"})
    samples: dict[str, list[float]] = {"take_first_s": [], "ask_first_s": []}
    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(backend.run, spec)
        try:
            control = _listening(backend, tid, running.done)
            for _ in range(cycles):
                for name, order in (("take_first_s", take_first), ("ask_first_s", ask_first)):
                    samples[name].append(order(backend, tid, control, two, one))
                    _give_back(backend, tid, control, two, one)
                    time.sleep(0.2)
        finally:
            backend.end_trajectory(tid)
            with contextlib.suppress(SandboxError):
                running.result(timeout=60)
    take, ask = (statistics.median(samples[n]) for n in ("take_first_s", "ask_first_s"))
    return {"backend": backend.name, "cycles": cycles, "take_first_s": take, "ask_first_s": ask,
            "ratio": ask / take, "samples": samples}


def _listening(backend: SandboxBackend, tid: str, ended: Callable[[], bool]) -> RunControl:
    """The run's control once both its workers collected (raises when the run ended first)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not ended():
        control = run_control(backend, tid, SOCKET)
        with contextlib.suppress(OSError, ValueError):
            if control is not None and control("status", 5.0).get("active") == 2:
                return control
        time.sleep(0.05)
    raise RuntimeError(f"the malleable run on {backend.name} did not start its 2 workers")


@contextlib.contextmanager
def backends(docker_url: str) -> Iterator[tuple[list[SandboxBackend], list[str]]]:
    """The backends this machine runs, and a line for each it cannot."""
    root = Path(tempfile.mkdtemp(prefix="tangram-bench-takeback-", dir="/var/tmp"))  # nosec B108 # world-traversable parent for the sandbox uids
    root.chmod(0o755)
    made: list[SandboxBackend] = [BwrapBackend(root / "bwrap", SandboxLimits())]
    missing: list[str] = []
    try:
        made.append(DockerBackend(root / "docker", SandboxLimits(), docker_url=docker_url))
    except SandboxError as exc:
        missing.append(f"docker: not measured ({exc})")
    try:
        yield made, missing
    finally:
        for backend in made:
            backend.close()
        shutil.rmtree(root, ignore_errors=True)


def row_text(row: dict[str, Any]) -> str:
    """One table row: medians and (min-max) ranges in milliseconds."""
    def cell(name: str) -> str:
        values = row["samples"][name]
        return (f"{row[name] * 1000:.2f} ({min(values) * 1000:.2f}-"
                f"{max(values) * 1000:.2f})")
    return (f"| {row['backend']} | {row['cycles']} | {cell('take_first_s')} | "
            f"{cell('ask_first_s')} | {row['ratio']:.1f}x |")


def section_text(rows: Sequence[dict[str, Any]], missing: Sequence[str], command: str) -> str:
    """The section ``malleable-takeback``."""
    lines = [f"## {NAME}", "", f"Command: `{command}`", "",
             "A real malleable pytest run per sandbox backend, 2 workers on 2 cores of this "
             "machine; each cycle takes one core back in each order, alternating, from the "
             "node's decision until the core is out of the run's cpuset (free for the action "
             f"waiting for it). 1-minute load average at the end: {os.getloadavg()[0]:.2f}.", "",
             "| backend | cycles | cpuset first, as the node does (ms): median (min-max) | "
             "ask the run first, the earlier order (ms) | ask first / cpuset first |",
             "| --- | --- | --- | --- | --- |"]
    lines += [row_text(row) for row in rows]
    lines += [f"- {line}" for line in missing]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure each backend, print the section and, with ``--out``, publish it."""
    parser = argparse.ArgumentParser(prog="tangram bench takeback")
    parser.add_argument("--cycles", type=int, default=20, help="take-backs in each order")
    parser.add_argument("--docker-url", default=None,
                        help="a Docker engine (default: TANGRAM_SANDBOX_DOCKER_URL)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--out", type=Path, default=None,
                        help="publish the section under OUT (docs: docs/results.md)")
    args = parser.parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2 or args.cycles < 1:
        raise SystemExit("tangram bench takeback: needs 2 CPU cores and --cycles >= 1")
    command = "tangram bench takeback " + shlex.join(
        list(sys.argv[1:] if argv is None else argv))
    url = args.docker_url or Settings.from_env().sandbox.docker_url
    with backends(url) as (made, missing):
        rows = [measure(backend, args.cycles, (cores[0], cores[1])) for backend in made]
    if args.json:
        print(json.dumps({"rows": rows, "missing": missing}))
        return 0
    text = section_text(rows, missing, command)
    if args.out is not None:
        publish(args.out, NAME, text)
    print(text)
    return 0
