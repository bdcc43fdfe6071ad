"""PNG plots of benchmark results with matplotlib (Agg backend, no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from tangram_bench.plan import axis_value
from tangram_bench.summary import ALL, Summary

PARTS = ("queue", "exec", "overhead")
STYLES = ("-", "--", ":", "-.")
COLORS = {"queue": "#d62728", "exec": "#1f77b4", "overhead": "#7f7f7f"}


def act_cdf(totals: Mapping[str, Mapping[str, Sequence[float]]], path: Path, title: str) -> None:
    """The ACT CDF of each system (log-scaled seconds), one panel per action kind.

    ``totals`` maps a system to its ACTs per kind.
    """
    kinds = list(dict.fromkeys(k for per_kind in totals.values() for k in per_kind))
    figure, panels = plt.subplots(1, len(kinds), figsize=(5 * len(kinds), 4.5), squeeze=False)
    for panel, kind in zip(panels[0], kinds, strict=True):
        for i, (system, per_kind) in enumerate(totals.items()):
            values = np.sort(np.maximum(np.asarray(per_kind.get(kind, []), dtype=float), 1e-4))
            if len(values):
                panel.plot(values, np.arange(1, len(values) + 1) / len(values), label=system,
                           linestyle=STYLES[i % len(STYLES)])
        panel.set_xscale("log")
        panel.set_xlabel(f"{kind}: action completion time (s)")
        panel.set_ylabel("fraction of actions")
        panel.grid(True, which="both", alpha=0.3)
    panels[0][0].legend()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def breakdown(summaries: Sequence[Summary], path: Path, title: str) -> None:
    """Stacked mean queue / exec / overhead per system, one panel per action kind."""
    kinds = [k.kind for k in summaries[0].kinds if k.kind != ALL] or [ALL]
    figure, panels = plt.subplots(1, len(kinds), figsize=(4.2 * len(kinds), 4.5),
                                  squeeze=False)
    names = [s.system for s in summaries]
    for panel, kind in zip(panels[0], kinds, strict=True):
        bottom = np.zeros(len(summaries))
        for part in PARTS:
            values = np.array([getattr(s.kind(kind), part, 0.0) if s.kind(kind) else 0.0
                               for s in summaries])
            panel.bar(names, values, bottom=bottom, label=part, color=COLORS[part])
            bottom += values
        panel.set_title(f"{kind}: mean ACT")
        panel.set_ylabel("seconds")
        panel.tick_params(axis="x", rotation=30)
    panels[0][0].legend()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def sweep(summaries: Sequence[Summary], axis: str, path: Path, title: str) -> None:
    """Mean ACT and external time per trajectory against the swept value, per system (a
    point without a value, the default mix of ``parallel``, has no place on the axis)."""
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    for i, system in enumerate(dict.fromkeys(s.system for s in summaries)):
        valued = [(x, s) for s in summaries
                  if s.system == system and (x := axis_value(s.point, axis)) is not None]
        mine = [s for _, s in sorted(valued, key=lambda pair: pair[0])]
        xs = sorted(x for x, _ in valued)
        style = STYLES[i % len(STYLES)]
        left.plot(xs, [s.mean_act for s in mine], marker="o", label=system, linestyle=style)
        right.plot(xs, [s.external for s in mine], marker="o", label=system, linestyle=style)
    for axes, label in ((left, "mean ACT (s)"), (right, "external time per trajectory (s)")):
        axes.set_xlabel(axis)
        axes.set_ylabel(label)
        axes.set_yscale("log")
        axes.grid(True, which="both", alpha=0.3)
    left.legend()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
