"""The configuration of a real MOPD run: its systems and defaults, the emulated hardware, the
presets simulated beside it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tangram_bench.mopd_real.measured import MeasuredCluster, RestoreFit
from tangram_bench.sim.cluster import Cluster
from tangram_bench.sim.costs import CONTROL_PLANE, Costs
from tangram_bench.sim.durations import DEFAULT_DURATIONS
from tangram_bench.teachers.model import restore_seconds
from tangram_bench.teachers.repository import TeacherPhysics
from tangram_bench.workloads.model import GpuService
from tangram_celery.pools.gpu_pool.policy import DEFAULT_NODE_SIZE

SYSTEMS = ("tangram", "tangram:ersa", "celery", "celery:cache", "fixed-dop-4:cache", "static")
DEFAULT_BATCH = 48
DEFAULT_GPUS = 24
DEFAULT_TIME_SCALE = 1.0
DEFAULT_THINK_SCALE = 0.1
REAL_DURATIONS = (DEFAULT_DURATIONS, "oracle")
"""What the real MOPD bench can tell the pools: nothing (they learn), or the truth."""
POOL = "mopd"
GPU_MEMORY_MB = int(Cluster.gpu_memory_gb * 1000)
"""Memory per simulated GPU for the manager's bookkeeping, the simulator's (80 GB)."""
DISPATCH_S = CONTROL_PLANE.dispatch_s
"""Per-action control-plane cost charged to the pooled systems in the simulation beside the real
run (presets ``sim`` and ``sim-measured``): the cost ``tangram bench costs`` measured for the
coding sim over several runs (client, publish, broker, hand-off and result path of a trivial
action; :data:`tangram_bench.sim.costs.CONTROL_PLANE`). A teacher call pays the same path and no
sandbox set-up."""
SIM_COSTS = Costs(dispatch_s=DISPATCH_S)
MEASURED = "sim-measured"
"""The preset of the simulation charged the restore times the real runs measured."""
WORKERS = {"tangram": None, "tangram:ersa": "elastic", "celery": "fcfs-min",
           "celery:cache": "fcfs-min", "fixed-dop-4:cache": "fcfs-min", "static": "fcfs-min"}
CACHE = ":cache"
"""The suffix of the cache-aware pooled baselines: their pool workers run ``--cache-aware``
(the simulator's ``:cache`` systems, :mod:`tangram_bench.sim.systems`)."""


@dataclass(frozen=True)
class RealGpuConfig:
    """The emulated hardware of a real run: ``gpus`` simulated GPUs in nodes of ``node_size``,
    the restore physics (the simulator's flags, in the workload's unscaled seconds) and the
    time scale applied to every duration."""

    gpus: int = DEFAULT_GPUS
    time_scale: float = DEFAULT_TIME_SCALE
    think_scale: float = DEFAULT_THINK_SCALE
    load_init_s: float = Cluster.load_init_s
    restore_gbps: float = Cluster.restore_gbps
    node_size: int = DEFAULT_NODE_SIZE
    durations: str = DEFAULT_DURATIONS

    def __post_init__(self) -> None:
        if self.durations not in REAL_DURATIONS:
            raise ValueError(f"--durations {self.durations}: the real MOPD stack takes "
                             f"{' or '.join(REAL_DURATIONS)}")
        if self.gpus < 1 or self.gpus % self.node_size:
            raise ValueError(f"--gpus {self.gpus}: use a multiple of {self.node_size}")
        if not self.time_scale > 0 or not self.think_scale > 0:
            raise ValueError("--time-scale and --think-scale must be positive")

    @property
    def physics(self) -> TeacherPhysics:
        """What the emulated teachers read from their configs."""
        return TeacherPhysics(self.load_init_s, self.restore_gbps, self.time_scale)

    def cluster(self, fit: RestoreFit | None = None) -> Cluster:
        """The simulated cluster of the same run: the same GPUs and memory, the restore
        physics at the time scale (so :meth:`Cluster.load_s` is the teachers' restore); with
        ``fit``, each restore also costs what the real stack measured beyond that."""
        return MeasuredCluster(
            cpu_nodes=1, cores_per_node=8, numa_per_node=1,
            gpu_nodes=self.gpus // self.node_size, gpus_per_node=self.node_size,
            load_init_s=self.load_init_s * self.time_scale,
            restore_gbps=self.restore_gbps / self.time_scale,
            restore_fixed_s=fit.fixed_s if fit else 0.0,
            restore_per_gpu_s=fit.per_gpu_s if fit else 0.0)

    def restore_prior_s(self, services: Sequence[GpuService]) -> float:
        """``TANGRAM_GPU_RESTORE_S`` of the pool (its restore estimate until it has measured
        one): the mean restore of the teachers at their smallest parallelism."""
        restores = [restore_seconds(self.load_init_s, s.weights_gb, self.restore_gbps,
                                    s.dops[0], self.time_scale) for s in services]
        return sum(restores) / len(restores) if restores else 0.0
