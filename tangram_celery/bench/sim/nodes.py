"""Pooled CPU nodes (tangram, fixed DoP, plain Celery): per-node queues, per-node policy.

Each trajectory is pinned to one node at its first action: the node with a free core that
holds the fewest trajectories (balancing their memory), ties to the most free cores, then the
lowest index; it stays there (its environment lives there). Every action pays ``dispatch_s``
before it joins its node's queue; each node schedules itself with its own policy instance
(:class:`~tangram_celery.bench.sim.pooled.UnitPool`), cores split evenly over NUMA groups.
"""

from __future__ import annotations

from tangram_celery.bench.sim.cluster import Cluster
from tangram_celery.bench.sim.costs import Costs
from tangram_celery.bench.sim.policy import PolicyFactory, Shape
from tangram_celery.bench.sim.pooled import PooledBackend, UnitPool, View
from tangram_celery.bench.sim.record import Live
from tangram_celery.bench.workloads.model import Workload
from tangram_celery.scheduling import Core, CpuPool, Pool


def cpu_view(name: str, cores: tuple[Core, ...]) -> View:
    """The scheduler's view of one node, from its free core ids."""

    def view(free: tuple[int, ...]) -> Pool:
        return CpuPool(name, tuple(cores[i] for i in free), len(cores))

    return view


class CpuNodes(PooledBackend):
    """The CPU backend of the pooled systems."""

    resource = "cpu"

    def __init__(self, workload: Workload, cluster: Cluster, shape: Shape,
                 policy: PolicyFactory, costs: Costs) -> None:
        size = cluster.cores_per_node
        group = size // cluster.numa_per_node
        cores = tuple(Core(i, i // group) for i in range(size))
        pools = [UnitPool(f"cpu-{n}", range(size), cpu_view(f"cpu-{n}", cores), policy())
                 for n in range(cluster.cpu_nodes)]
        super().__init__(workload, shape, costs.dispatch_s, pools)
        self.pins: dict[int, int] = {}
        self.pinned = [0] * len(self.pools)

    def route(self, live: Live) -> int:
        """The trajectory's node, pinned at its first action."""
        node = self.pins.get(live.trajectory)
        if node is None:
            node = min(range(len(self.pools)), key=lambda n: (
                not self.pools[n].free, self.pinned[n], -len(self.pools[n].free), n))
            self.pins[live.trajectory] = node
            self.pinned[node] += 1
        return node

    def end(self, trajectory: int, now: float) -> None:
        """Unpin the trajectory's environment."""
        node = self.pins.pop(trajectory, None)
        if node is not None:
            self.pinned[node] -= 1
