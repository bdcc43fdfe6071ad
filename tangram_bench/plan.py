"""What one ``tangram bench`` invocation runs: its points, systems and cost presets (pure).

A *point* is one setting of the swept knobs (``batch``, ``cores``, ``gpus``, ``parallel``);
every system runs at every point under every cost preset. Without ``--sweep`` there is one
point, the defaults. A sweep always runs its base point (the knob at its base value: the
default or the value given, for ``parallel`` the default mix), and its headline is there, never
at the end of the sweep that favours one system.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


DEFAULT_MIX = "default mix"
"""How a sweep table names the base point of the ``parallel`` sweep: the workload's own
parallel fractions (the coding workload draws each suite's from U(0.5, 0.99))."""


def points(base: Point, sweep: str | None, values: tuple[float, ...] | None) -> list[Point]:
    """The points of a sweep over ``sweep`` (or just ``base``), in ascending order of the knob
    (the default mix first); ``base`` is added when ``values`` lack its value."""
    if sweep is None:
        return [base]
    if sweep not in SWEEPS:
        raise ValueError(f"unknown sweep {sweep!r}; one of {sorted(SWEEPS)}")
    chosen = values or SWEEPS[sweep]
    if sweep == "parallel":
        swept = [replace(base, parallel=float(v)) for v in chosen]
    else:
        swept = [replace(base, **{sweep: int(v)}) for v in chosen]
    if all(getattr(p, sweep) != getattr(base, sweep) for p in swept):
        swept.append(base)
    unique = {getattr(p, sweep): p for p in swept}
    return [unique[v] for v in sorted(unique, key=_order)]


def _order(value: float | None) -> tuple[bool, float]:
    return value is not None, value or 0.0


def headline(all_points: Sequence[Point], base: Point, sweep: str | None) -> Point:
    """The point the headline tables use: the base point (the swept knob at its base value);
    ValueError if the sweep lacks it (:func:`points` always has it)."""
    if sweep is None:
        return all_points[0]
    wanted = getattr(base, sweep)
    found = next((p for p in all_points if getattr(p, sweep) == wanted), None)
    if found is None:
        raise ValueError(f"the {sweep} sweep lacks its base point ({sweep} {wanted})")
    return found


def axis_value(point: Mapping[str, object], axis: str) -> float | None:
    """The swept knob's value in a summary's point (None: the default mix of ``parallel``)."""
    value = point.get(axis)
    return None if value is None else float(value)  # type: ignore[arg-type]


def axis_values(all_points: Sequence[Mapping[str, object]], axis: str) -> list[float | None]:
    """The distinct values of ``axis`` over ``all_points``, in the order of :func:`points`."""
    return sorted({axis_value(p, axis) for p in all_points}, key=_order)


def axis_label(value: float | None) -> str:
    """How a sweep table names a point's value."""
    if value is None:
        return DEFAULT_MIX
    return str(int(value)) if value.is_integer() else f"{value:g}"


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

