"""Pure routing policy: which queue an action goes to, and which CPU node a trajectory lives on.

No I/O here: :mod:`tangram_celery.pools.registry` gathers the node views from Redis, calls these
functions, and stores the decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tangram_celery import keys
from tangram_celery.action import Action
from tangram_celery.errors import NoCapacityError, RoutingError
from tangram_celery.keys import DEFAULT_GPU_POOL


@dataclass(frozen=True)
class NodeView:
    """What the router knows of one CPU node at decision time."""

    name: str
    cores: int
    free_cores: int
    memory_mb: float
    reserved_mb: float
    alive: bool = True
    trajectories: int = 0
    """Trajectories pinned to the node now."""
    starting: bool = False
    """Announced by an autoscaler that is starting it; its worker has not registered yet."""

    @property
    def free_memory_mb(self) -> float:
        """Memory not yet reserved by pinned trajectories."""
        return self.memory_mb - self.reserved_mb

    def trajectory_load_after(self) -> float:
        """Pinned trajectories per core once one more is placed on the node."""
        return (self.trajectories + 1) / self.cores if self.cores > 0 else float("inf")

    def memory_load_after(self, extra_mb: float) -> float:
        """Fraction of the node's memory reserved once ``extra_mb`` more is placed on it."""
        return (self.reserved_mb + extra_mb) / self.memory_mb if self.memory_mb > 0 else 1.0


def choose_node(nodes: Sequence[NodeView], cores: int, memory_mb: float) -> str:
    """Pick the node for a trajectory's first action.

    Among live nodes with enough unreserved memory for the whole trajectory, prefer the fewest
    pinned trajectories per core after placement (each trajectory is future load, which a
    heartbeat's free cores cannot show during a burst of new trajectories, nor on a node an
    autoscaler is still starting); then those with ``cores`` free now; then the lowest memory
    load after placement, then the name. Raises :class:`NoCapacityError` when no live node has
    the memory.
    """
    fits = [n for n in nodes if n.alive and n.free_memory_mb >= memory_mb and n.cores >= cores]
    if not fits:
        alive = [n.name for n in nodes if n.alive]
        raise NoCapacityError(
            f"no live CPU node has {memory_mb:g} MB free and {cores} cores for a new trajectory "
            f"(live nodes: {alive or 'none'}); start a node with `tangram worker cpu` or lower "
            "the trajectory's memory"
        )
    best = min(
        fits,
        key=lambda n: (n.trajectory_load_after(), n.free_cores < cores,
                       n.memory_load_after(memory_mb), n.name),
    )
    return best.name


def trajectory_memory_mb(action: Action, default_mb: float) -> float:
    """The memory a trajectory reserves on its node: the action's hint, else the default."""
    if action.trajectory_memory_mb is not None:
        return action.trajectory_memory_mb
    memory = action.cost.get("memory_mb")
    return max(memory.max, default_mb) if memory is not None else default_mb


def queue_for(action: Action, node: str | None) -> str:
    """The queue of an action once its CPU node (if any) is known."""
    if action.pool == "cpu":
        if node is None:
            raise RoutingError(f"action {action.id}: a CPU action needs its trajectory's node")
        return keys.cpu_queue(node)
    if action.pool == "gpu":
        pool = action.payload.get("pool", DEFAULT_GPU_POOL)
        return keys.gpu_queue(str(pool))
    apis = action.apis()
    return keys.api_queue(apis[0])
