"""What a malleable test run costs and gains, on the test suites of published packages.

    tangram bench malleable [--suites DIR] [--repeat 3] [--json] [--out docs]

For each suite the set-up unpacked (``bash scripts/run.sh setup`` puts them in
``$VENV/share/tangram-test-suites``), real pytest processes pinned to cores, the median of
``--repeat`` runs of each:

- ``plain_1core_s``: a plain ``pytest`` on one core;
- ``malleable_1core_s``: a malleable run with one worker on one core (the runner's own cost is
  its difference from the plain run);
- ``worker_start_s``: a worker's start and collection, from its start to its test ids (the
  runner's ``--malleable-stats``), on one core;
- ``malleable_2core_s`` and ``xdist_2core_s``: a malleable run with 2 workers and ``pytest -n 2``
  on two cores; ``speedup_2core`` and ``xdist_speedup_2core``: ``plain_1core_s`` over them;
- ``retire_s``: in a 2-worker run told to ``shrink`` once a third of its tests are done, from
  the answer to the end of the retiring worker's last test (the node takes its core back at the
  answer; the worker finishes its current test on the cores left), and ``exit_s`` from then to
  the worker's exit (its session's end). ``-`` when the run ended first.

Wall-clock figures of this machine, measured as they come; nothing is assumed. With ``--out``
the table becomes the section ``malleable-suites`` (``OUT/bench/malleable-suites.md``, and its
rows as ``.json``, the input of :mod:`tangram_bench.workloads.suites`).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tangram_bench.report import publish
from tangram_celery.sandbox.malleable import PLUGIN, resize

SUITES_DIR = Path(sys.prefix) / "share" / "tangram-test-suites"
COLUMNS = ("suite", "tests", "plain_1core_s", "malleable_1core_s", "worker_start_s",
           "malleable_2core_s", "speedup_2core", "xdist_2core_s", "xdist_speedup_2core",
           "retire_s", "exit_s")
POLL_S = 0.005


def suite_dirs(root: Path) -> list[Path]:
    """The unpacked suites under ``root`` (every directory but the sdists')."""
    found = sorted(p for p in root.iterdir() if p.is_dir() and p.name != "sdists") \
        if root.is_dir() else []
    if not found:
        raise SystemExit(f"tangram: error: no test suites in {root}; run "
                         "`bash scripts/run.sh setup`, which fetches them")
    return found


def pytest_command(suite: Path, args: list[str]) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of ``python -m pytest -q -p no:cacheprovider *args`` in
    ``suite`` (its package importable)."""
    root = suite / "src" if (suite / "src").is_dir() else suite
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)}
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], env


def timed_pytest(suite: Path, args: list[str], cores: set[int]) -> tuple[float, str]:
    """Run ``python -m pytest -q -p no:cacheprovider *args`` in ``suite`` on ``cores``: its wall
    time and its last output line (the summary). A run that fails is an error."""
    argv, env = pytest_command(suite, args)
    began = time.monotonic()
    done = subprocess.run(  # nosec B603 # this interpreter running pytest, no shell
        argv, cwd=suite, env=env, capture_output=True, text=True, check=False,
        preexec_fn=lambda: os.sched_setaffinity(0, cores))
    took = time.monotonic() - began
    if done.returncode != 0:
        raise SystemExit(f"tangram: error: {' '.join(args) or 'pytest'} in {suite} exited "
                         f"{done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    lines = done.stdout.strip().splitlines()
    return took, lines[-1] if lines else ""


def retire_delay(suite: Path, cores: set[int], scratch: Path) -> tuple[float, float] | None:
    """Seconds from a mid-run ``shrink`` answer to the end of the retiring worker's last test,
    and from then to its exit (None when the run ended before a third of its tests were done
    and it could be told)."""
    control, stats = scratch / "control.sock", scratch / "retire.json"
    argv, env = pytest_command(suite, ["-p", PLUGIN, "--malleable=2",
                                       f"--malleable-control={control}",
                                       f"--malleable-stats={stats}"])
    proc = subprocess.Popen(  # nosec B603 # this interpreter running pytest, no shell
        argv, cwd=suite, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        preexec_fn=lambda: os.sched_setaffinity(0, cores))
    answer: dict[str, Any] = {}
    try:
        while proc.poll() is None and not answer:
            time.sleep(POLL_S)
            try:
                status = resize(str(control), "status")
            except OSError:
                continue
            if status["collected"] and status["done"] * 3 >= status["tests"]:
                answer = resize(str(control), "shrink")
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if not answer.get("ok"):
        return None
    data = json.loads(stats.read_text())
    shrunk = data["resizes"][0]["at_s"]
    worker = next(w for w in data["workers"] if w["pid"] == answer["retiring"])
    if worker["end_at_s"] is None or worker["last_done_at_s"] is None:
        return None
    last = max(worker["last_done_at_s"], shrunk)
    return float(last - shrunk), float(worker["end_at_s"] - last)


def measure(suite: Path, repeat: int, cores: list[int]) -> dict[str, Any]:
    """One suite's row: the median of ``repeat`` runs of each kind."""
    one, two = {cores[0]}, set(cores[:2])
    samples: dict[str, list[float]] = {name: [] for name in COLUMNS[2:]}
    summary = ""
    with tempfile.TemporaryDirectory(prefix="tangram-bench-malleable-") as scratch:
        stats = Path(scratch) / "stats.json"
        for _ in range(repeat):
            plain, summary = timed_pytest(suite, [], one)
            samples["plain_1core_s"].append(plain)
            alone, _ = timed_pytest(suite, ["-p", PLUGIN, "--malleable=1",
                                            f"--malleable-stats={stats}"], one)
            samples["malleable_1core_s"].append(alone)
            workers = json.loads(stats.read_text())["workers"]
            samples["worker_start_s"] += [w["collect_s"] for w in workers if w["collect_s"]]
            pair, _ = timed_pytest(suite, ["-p", PLUGIN, "--malleable=2"], two)
            samples["malleable_2core_s"].append(pair)
            samples["speedup_2core"].append(plain / pair)
            xdist, _ = timed_pytest(suite, ["-n", "2"], two)
            samples["xdist_2core_s"].append(xdist)
            samples["xdist_speedup_2core"].append(plain / xdist)
            retire = retire_delay(suite, two, Path(scratch))
            if retire is not None:
                samples["retire_s"].append(retire[0])
                samples["exit_s"].append(retire[1])
    row: dict[str, Any] = {"suite": suite.name, "tests": summary.rsplit(" in ", 1)[0]}
    row.update({name: round(statistics.median(values), 3) if values else "-"
                for name, values in samples.items()})
    return row


def table_of(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(row[c]) for c in COLUMNS) + " |" for row in rows]
    return "\n".join(lines)


SECTION = "malleable-suites"


def section_text(rows: list[dict[str, Any]], repeat: int, load: float, command: str) -> str:
    """The section ``malleable-suites``: every suite's row, the worker start cost and the
    take-back delay over the suites, and the load the machine was under."""
    def span(column: str) -> str:
        values = [row[column] for row in rows if isinstance(row[column], (int, float))]
        return f"{min(values)}-{max(values)} s" if values else "not measured"
    return "\n".join([
        f"## {SECTION}", "", f"Command: `{command}`", "",
        "The test suites of published packages (fetched by the set-up), real pytest processes "
        f"pinned to cores, the median of {repeat} runs of each kind; 1-minute load average at the "
        f"end: {load:.2f}.", "", table_of(rows), "",
        f"- A worker's start and collection (the grow cost): {span('worker_start_s')} over the "
        "suites.",
        f"- Take-back delay, from a shrink's answer to the end of the retiring worker's last "
        f"test: {span('retire_s')}; its exit after that: {span('exit_s')}."])


def publish_rows(out: Path, rows: list[dict[str, Any]], repeat: int, load: float,
                 command: str) -> None:
    """Write the section and its rows (``OUT/bench/malleable-suites.json``), rebuild the
    results page."""
    (out / "bench").mkdir(parents=True, exist_ok=True)
    (out / "bench" / f"{SECTION}.json").write_text(
        json.dumps({"rows": rows, "repeat": repeat, "load_1min": load}, indent=1) + "\n")
    publish(out, SECTION, section_text(rows, repeat, load, command))


def main(argv: Sequence[str] | None = None) -> int:
    """Measure every suite; print the table, or with ``--json`` one JSON object."""
    parser = argparse.ArgumentParser(prog="tangram bench malleable")
    parser.add_argument("--suites", type=Path, default=SUITES_DIR,
                        help=f"where the unpacked suites are (default {SUITES_DIR})")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each kind (the median)")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    parser.add_argument("--out", type=Path, help="write the section malleable-suites here")
    args = parser.parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("tangram: error: the 2-core figures need 2 cores; this process has "
                         f"{len(cores)}")
    rows = [measure(suite, args.repeat, cores) for suite in suite_dirs(args.suites)]
    load = os.getloadavg()[0]
    if args.out is not None:
        given = list(sys.argv[1:] if argv is None else argv)
        publish_rows(args.out, rows, args.repeat, load,
                     "tangram bench malleable " + shlex.join(given))
    if args.json:
        print(json.dumps({"rows": rows, "repeat": args.repeat, "load_1min": load}))
    else:
        print(table_of(rows))
        print(f"\nmedian of {args.repeat} runs each; 1-minute load average at the end: "
              f"{load:.2f}")
    return 0
