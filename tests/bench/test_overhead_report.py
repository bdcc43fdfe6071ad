"""The overhead benchmark's report: every key the issue names, p50s in ms, targets as data."""

from __future__ import annotations

from tangram_bench.overhead_report import report_of, table_of

KEYS = (
    "raw_celery_p50_ms", "tangram_trivial_p50_ms", "warm_exec_p50_ms", "warm_exec_true_p50_ms",
    "warm_exec_print_p50_ms", "cold_start_p50_ms", "docker_warm_exec_p50_ms",
    "print_seq_p50_ms", "baseline_print_seq_p50_ms", "print_32_inflight_per_s",
    "baseline_print_32_inflight_per_s", "cpu_32_inflight_per_s", "cpu_ceiling_per_s",
    "fork_exec_floor_p50_ms",
)


def test_the_report_has_every_key_and_checks_the_targets() -> None:
    samples = {
        "raw": [0.002, 0.002, 0.003], "tangram_trivial": [0.004], "warm_true": [0.001],
        "warm_print": [0.004], "cold": [0.008], "print_seq": [0.005],
        "baseline_print_seq": [0.020], "print_32": [200.0], "baseline_print_32": [80.0],
        "cpu_32": [9.0], "fork_exec": [0.0015],
    }
    report = report_of(samples, "no engine", n=3, rounds=1, cpu_alone_s=0.19, cores=2)
    assert all(key in report for key in KEYS)
    assert report["raw_celery_p50_ms"] == 2.0
    assert report["docker_warm_exec_p50_ms"] is None and report["docker_error"] == "no engine"
    assert abs(report["cpu_ceiling_per_s"] - 2 / 0.19) < 1e-9
    met = report["targets_met"]
    assert met["tangram_trivial <= raw_celery + 3 ms"] is True
    assert met["warm_exec_print <= 3 ms"] is False
    assert met["docker_warm_exec <= 5 ms"] is None
    assert met["print_seq <= 0.3x baseline"] is True
    assert met["print_32_inflight >= 2x baseline"] is True
    assert met["cpu_32_inflight >= 95% of ceiling"] is False
    assert "MISSED" in table_of(report) and "n/a" in table_of(report)
