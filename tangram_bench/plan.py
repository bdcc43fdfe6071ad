"""What one ``tangram bench`` invocation runs: its points, systems and cost presets (pure).

A *point* is one setting of the swept knobs (``batch``, ``cores``, ``gpus``, ``parallel``);
every system runs at every point under every cost preset. Without ``--sweep`` there is one
point, the defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from tangram_bench.sim.cluster import Cluster
from tangram_bench.workloads import CodingParams, Workload, build, coding

SWEEPS: dict[str, tuple[float, ...]] = {
    "batch": (256, 512, 1024, 1280, 2048),
    "cores": (768, 1280, 1792, 2560, 3840),
    "gpus": (8, 16, 24, 32, 40),
    "parallel": (0.5, 0.7, 0.9, 0.99),
}
"""Default values of each sweep (the paper's Figures 9-11 range for batch and cores)."""


@dataclass(frozen=True)
class Point:
    """One setting of the knobs."""

    batch: int = 1280
    cores: int = 1280
    gpus: int = 40
    parallel: float | None = None
    group: int | None = None
    """GRPO group size G of the coding workload (None: the generator's default)."""

    def as_dict(self) -> dict[str, object]:
        """The knobs as plain data (``parallel`` and ``group`` only when set)."""
        knobs: dict[str, object] = {"batch": self.batch, "cores": self.cores,
                                    "gpus": self.gpus}
        if self.parallel is not None:
            knobs["parallel"] = self.parallel
        if self.group is not None:
            knobs["group"] = self.group
        return knobs

    def cluster(self, physics: Mapping[str, float] | None = None, cores_per_node: int = 256,
                gpus_per_node: int = 8) -> Cluster:
        """The simulated cluster of this point (``physics``: other :class:`Cluster` fields)."""
        if self.cores % cores_per_node or self.gpus % gpus_per_node:
            raise ValueError(f"cores must be a multiple of {cores_per_node} and gpus of "
                             f"{gpus_per_node}")
        given = physics or {}
        return Cluster(cpu_nodes=self.cores // cores_per_node, cores_per_node=cores_per_node,
                       gpu_nodes=self.gpus // gpus_per_node, gpus_per_node=gpus_per_node,
                       load_init_s=given.get("load_init_s", Cluster.load_init_s),
                       restore_gbps=given.get("restore_gbps", Cluster.restore_gbps))


def points(base: Point, sweep: str | None, values: tuple[float, ...] | None) -> list[Point]:
    """The points of a sweep over ``sweep`` (or just ``base``)."""
    if sweep is None:
        return [base]
    if sweep not in SWEEPS:
        raise ValueError(f"unknown sweep {sweep!r}; one of {sorted(SWEEPS)}")
    chosen = values or SWEEPS[sweep]
    if sweep == "parallel":
        return [replace(base, parallel=float(v)) for v in chosen]
    return [replace(base, **{sweep: int(v)}) for v in chosen]


def headline(all_points: list[Point], base: Point, sweep: str | None) -> Point:
    """The point the headline tables use: the base value of the swept knob if swept over,
    else the last point."""
    if sweep is None:
        return all_points[0]
    wanted = getattr(base, sweep)
    return next((p for p in all_points if getattr(p, sweep) == wanted), all_points[-1])


def workload_at(name: str, point: Point, seed: int, trace: Workload | None = None) -> Workload:
    """The workload of ``point``: a generated one, or the trace (whose size is fixed)."""
    if trace is not None:
        return trace
    if name == "coding" and (point.parallel is not None or point.group is not None):
        params = CodingParams(parallel=point.parallel)
        return coding(point.batch, seed, params if point.group is None
                      else replace(params, group=point.group))
    if point.parallel is not None:
        raise ValueError("the parallel sweep applies to the coding workload only")
    if point.group is not None:
        raise ValueError("--group (GRPO group size) applies to the coding workload only")
    return build(name, point.batch, seed)

