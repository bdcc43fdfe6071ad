"""The benchmark's figures: both variants at one concurrency, one model's results, the table."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Point:
    """Both variants at one concurrency: requests per second per round, in round order."""

    concurrency: int
    batched: tuple[float, ...]
    unbatched: tuple[float, ...]
    rows_per_execution: float | None = None

    @property
    def batched_rps(self) -> float:
        """Median over the rounds, with dynamic batching."""
        return statistics.median(self.batched)

    @property
    def unbatched_rps(self) -> float:
        """Median over the rounds, without."""
        return statistics.median(self.unbatched)

    @property
    def ratio(self) -> float:
        """Median batched over median unbatched throughput."""
        return self.batched_rps / self.unbatched_rps if self.unbatched_rps else 0.0

    @property
    def round_ratios(self) -> tuple[float, ...]:
        """Batched over unbatched in each round (the rounds measured the two side by side)."""
        return tuple(b / u if u else 0.0 for b, u in zip(self.batched, self.unbatched,
                                                         strict=True))

    def summary(self) -> dict[str, Any]:
        """The point as JSON-safe values."""
        ratios = self.round_ratios
        return asdict(self) | {"batched_rps": self.batched_rps,
                               "unbatched_rps": self.unbatched_rps, "ratio": self.ratio,
                               "ratio_min": min(ratios), "ratio_max": max(ratios)}


@dataclass(frozen=True)
class ModelResult:
    """The figures of one model."""

    model: str
    load_p50_s: float
    latency_p50_ms: float
    latency_p90_ms: float
    points: tuple[Point, ...]
    pa_points: tuple[Point, ...] = field(default=())

    def summary(self) -> dict[str, Any]:
        """The result as JSON-safe values."""
        return {"model": self.model, "load_p50_s": self.load_p50_s,
                "latency_p50_ms": self.latency_p50_ms, "latency_p90_ms": self.latency_p90_ms,
                "points": [p.summary() for p in self.points],
                "perf_analyzer": [p.summary() for p in self.pa_points]}


def _point_line(label: str, point: Point) -> str:
    ratios = point.round_ratios
    rows = f"{point.rows_per_execution:>10.1f}" if point.rows_per_execution is not None else ""
    return (f"  {label:<15}{point.concurrency:>5}{point.batched_rps:>14.0f}"
            f"{point.unbatched_rps:>16.0f}{point.ratio:>8.2f}x"
            f"   {min(ratios):.2f}-{max(ratios):.2f}x{rows}")


def render(results: Sequence[ModelResult], header: str) -> str:
    """The printed table."""
    lines = [header]
    for r in results:
        lines.append(f"{r.model}: load p50 {r.load_p50_s:.2f} s, one-by-one latency p50 "
                     f"{r.latency_p50_ms:.2f} ms, p90 {r.latency_p90_ms:.2f} ms")
        lines.append(f"  {'client':<15}{'conc':>5}{'batched rps':>14}{'unbatched rps':>16}"
                     f"{'ratio':>9}   {'rounds':<11}{'rows/exec':>10}")
        lines += [_point_line("ours (aio)", p) for p in r.points]
        lines += [_point_line("perf_analyzer", p) for p in r.pa_points]
    return "\n".join(lines)


NAME = "reward-batching"
"""The section ``python -m tangram_bench.reward --out DIR`` writes (``bench/<NAME>.md``)."""


def _cell(point: Point) -> str:
    ratios = point.round_ratios
    return (f"| {point.concurrency} | {point.batched_rps:.0f} | {point.unbatched_rps:.0f} "
            f"| {point.ratio:.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) |")


def section_text(results: Sequence[ModelResult], header: str, command: str) -> str:
    """The Markdown section :data:`NAME`: per model, its load time and one-by-one latency, then
    batched and unbatched throughput at each concurrency with their ratio (the median over the
    rounds and, in brackets, the range of each round's ratio)."""
    lines = [f"## {NAME}", "", f"Command: `{command}`", "", header + ".", ""]
    for r in results:
        lines += [f"### {r.model}", "",
                  f"Load p50 {r.load_p50_s:.2f} s; one-by-one latency p50 "
                  f"{r.latency_p50_ms:.2f} ms, p90 {r.latency_p90_ms:.2f} ms.", "",
                  "| client | concurrency | batched req/s | unbatched req/s "
                  "| batched / unbatched (range over rounds) |",
                  "| --- | --- | --- | --- | --- |"]
        lines += [f"| ours (aio) {_cell(p)}" for p in r.points]
        lines += [f"| perf_analyzer {_cell(p)}" for p in r.pa_points]
        lines.append("")
    return "\n".join(lines).rstrip("\n")
