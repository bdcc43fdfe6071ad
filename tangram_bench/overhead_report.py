"""The report of ``tangram bench overhead``: p50s and rates from the samples, the issue's
targets beside them, and the text table."""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

LATENCIES = {
    "raw_celery_p50_ms": "raw",
    "raw_celery_tangram_waiter_p50_ms": "raw_waiter",
    "tangram_trivial_p50_ms": "tangram_trivial",
    "warm_exec_p50_ms": "warm_true",
    "warm_exec_true_p50_ms": "warm_true",
    "warm_exec_print_p50_ms": "warm_print",
    "fork_exec_floor_p50_ms": "fork_exec",
    "cold_start_p50_ms": "cold",
    "docker_warm_exec_p50_ms": "docker_warm",
    "print_seq_p50_ms": "print_seq",
    "baseline_print_seq_p50_ms": "baseline_print_seq",
    "tangram_trivial_setup_p50_ms": "tangram_trivial_setup",
    "tangram_trivial_exec_p50_ms": "tangram_trivial_exec",
}
RATES = {
    "print_32_inflight_per_s": "print_32",
    "baseline_print_32_inflight_per_s": "baseline_print_32",
    "cpu_32_inflight_per_s": "cpu_32",
}


def _p50_ms(values: Sequence[float]) -> float | None:
    return statistics.median(values) * 1000 if values else None


def targets(r: Mapping[str, Any]) -> dict[str, bool | None]:
    """Each target of issue 18 against the report (None where a figure is missing)."""
    def check(ok: bool, *keys: str) -> bool | None:
        return None if any(r.get(k) is None for k in keys) else ok

    def g(key: str) -> float:
        value = r.get(key)
        return float(value) if value is not None else 0.0

    return {
        "tangram_trivial <= raw_celery + 3 ms": check(
            g("tangram_trivial_p50_ms") <= g("raw_celery_p50_ms") + 3,
            "tangram_trivial_p50_ms", "raw_celery_p50_ms"),
        "warm_exec_true <= 2 ms": check(g("warm_exec_true_p50_ms") <= 2, "warm_exec_true_p50_ms"),
        "warm_exec_print <= 3 ms": check(g("warm_exec_print_p50_ms") <= 3,
                                         "warm_exec_print_p50_ms"),
        "cold_start <= 10 ms": check(g("cold_start_p50_ms") <= 10, "cold_start_p50_ms"),
        "docker_warm_exec <= 5 ms": check(g("docker_warm_exec_p50_ms") <= 5,
                                          "docker_warm_exec_p50_ms"),
        "print_seq <= 0.3x baseline": check(
            g("print_seq_p50_ms") <= 0.3 * g("baseline_print_seq_p50_ms"),
            "print_seq_p50_ms", "baseline_print_seq_p50_ms"),
        "print_32_inflight >= 2x baseline": check(
            g("print_32_inflight_per_s") >= 2 * g("baseline_print_32_inflight_per_s"),
            "print_32_inflight_per_s", "baseline_print_32_inflight_per_s"),
        "cpu_32_inflight >= 95% of ceiling": check(
            g("cpu_32_inflight_per_s") >= 0.95 * g("cpu_ceiling_per_s"),
            "cpu_32_inflight_per_s", "cpu_ceiling_per_s"),
    }


def report_of(values: Mapping[str, list[float]], docker_error: str, n: int, rounds: int,
              cpu_alone_s: float, cores: int | None = None) -> dict[str, Any]:
    """The one JSON object the benchmark prints."""
    cores = cores or len(os.sched_getaffinity(0))
    report: dict[str, Any] = {k: _p50_ms(values.get(v, [])) for k, v in LATENCIES.items()}
    for key, name in RATES.items():
        rates = values.get(name, [])
        report[key] = statistics.median(rates) if rates else None
    report["cpu_snippet_alone_s"] = cpu_alone_s
    report["cpu_ceiling_per_s"] = cores / cpu_alone_s if cpu_alone_s > 0 else None
    report["cores"] = cores
    report["n"] = n
    report["rounds"] = rounds
    if docker_error:
        report["docker_error"] = docker_error
    report["targets_met"] = targets(report)
    return report


def table_of(report: Mapping[str, Any]) -> str:
    """The report as aligned text lines."""
    lines = []
    for key, value in report.items():
        if key == "targets_met":
            continue
        shown = f"{value:10.2f}" if isinstance(value, float) else f"{value!s:>10}"
        lines.append(f"{key:<38} {shown}")
    for name, ok in report["targets_met"].items():
        mark = "n/a" if ok is None else ("met" if ok else "MISSED")
        lines.append(f"target {name:<45} {mark}")
    return "\n".join(lines)
