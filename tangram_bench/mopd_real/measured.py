"""What the real MOPD runs measured: each run's record of Triton's work, and the restore fit.

:func:`restore_fit` draws from the real runs what a restore cost beyond the emulated time;
:class:`MeasuredCluster` is the simulated cluster charged that cost (preset ``sim-measured``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from tangram_bench.sim.cluster import Cluster
from tangram_bench.sim.record import RunResult
from tangram_bench.workloads.model import GpuService


@dataclass(frozen=True)
class RestoreFit:
    """What a restore cost on the real stack beyond the emulated time, as ``fixed_s +
    per_gpu_s * k`` on a chunk of ``k`` (least squares over ``samples`` restores): Triton
    starts one python-backend stub process per simulated GPU of the chunk, and they compete for
    this machine's CPUs with every other load and request of the moment."""

    fixed_s: float = 0.0
    per_gpu_s: float = 0.0
    samples: int = 0

    def extra_s(self, k: int) -> float:
        """Seconds beyond the emulated restore on a chunk of ``k``."""
        return self.fixed_s + self.per_gpu_s * k


def restore_fit(results: Iterable[RunResult]) -> RestoreFit:
    """The :class:`RestoreFit` of every restore of the real runs among ``results``: the line
    through (k, measured - emulated), neither coefficient below zero."""
    points = [(k, measured - emulated) for r in results if isinstance(r, RealGpuRun)
              for k, measured, emulated in r.restores]
    if not points:
        return RestoreFit()
    ks = np.array([k for k, _ in points], dtype=float)
    ys = np.array([y for _, y in points], dtype=float)
    if len(set(ks.tolist())) > 1:
        (fixed, per_gpu), *_ = np.linalg.lstsq(np.stack([np.ones_like(ks), ks], 1), ys,
                                               rcond=None)
    else:
        fixed, per_gpu = float(ys.mean()), 0.0
    if per_gpu < 0:
        fixed, per_gpu = float(ys.mean()), 0.0
    if fixed < 0:
        fixed, per_gpu = 0.0, float((ks * ys).sum() / (ks * ks).sum())
    return RestoreFit(max(float(fixed), 0.0), max(float(per_gpu), 0.0), len(points))


@dataclass(frozen=True)
class MeasuredCluster(Cluster):
    """The simulated cluster of a real run whose restores cost what that run measured: the
    emulated restore plus :class:`RestoreFit`'s extra on each chunk size."""

    restore_fixed_s: float = 0.0
    restore_per_gpu_s: float = 0.0

    def load_s(self, service: GpuService, dop: int) -> float:
        """The emulated restore plus the measured extra."""
        return super().load_s(service, dop) + self.restore_fixed_s + self.restore_per_gpu_s * dop


@dataclass
class RealGpuRun(RunResult):
    """A real run's records plus what Triton itself did (counted in its log) and what each
    restore cost against what the teacher emulated."""

    triton_loads: int = 0
    triton_unloads: int = 0
    warmup_loads: int = 0
    triton_crashes: int = 0
    """Runs of this system started again from scratch because tritonserver aborted."""
    unloads_after_stop: int = 0
    """Every unload in Triton's log once the workers stopped (each unloads its idle services);
    counted only when asked (``run_real(unload_wait_s=...)``)."""
    restores: list[tuple[int, float, float]] = field(default_factory=list)
    """(chunk size, measured set-up seconds, emulated restore seconds) of each call that
    restored its teacher."""
