"""The routing decision, pure: which queue an action goes to, and which node holds its trajectory.

:func:`route` is called once per submitted action with everything it reads already gathered
(:class:`RoutingInputs`: the live CPU nodes, the trajectory's pin, the GPU pool's published
view, the declared APIs); it returns a :class:`Route` and raises for an action no pool can ever
run. No I/O here: :class:`tangram_celery.client.router.Router` gathers the inputs from Redis
first and stores the pin the decision chose.

The checks only judge what is known: a GPU pool that publishes no inventory is not checked, and
a CPU node missing from the views is not checked against its cores.

A new trajectory that no live node has the memory for *now* is not refused: its route says
:class:`MemoryWait`, and the client parks it in a queue shared by every client until memory frees
up (:mod:`tangram_celery.client.waitlist`). The order is **strict FCFS**: while any trajectory
waits, a later one waits behind it even if it would fit (no backfill), so a small trajectory can
never delay a big one ahead of it. Only one that no live node could ever hold is refused at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tangram_celery import keys
from tangram_celery.action import Action
from tangram_celery.errors import NoCapacityError, RoutingError, ValidationError
from tangram_celery.keys import DEFAULT_GPU_POOL
from tangram_celery.managers.basic import ApiSpec, needs_of
from tangram_celery.pools.inventory import GpuPoolView
from tangram_celery.pools.registry import NodeView


@dataclass(frozen=True)
class RoutingInputs:
    """What :func:`route` reads, gathered before the call."""

    nodes: Sequence[NodeView] = ()
    """The registered CPU nodes (alive or not)."""
    pin: str | None = None
    """The node the action's trajectory is pinned to, if any."""
    gpu_pool: GpuPoolView | None = None
    """What the action's GPU pool publishes, if anything."""
    apis: Mapping[str, ApiSpec] = field(default_factory=dict)
    """The APIs declared in ``TANGRAM_API_LIMITS``."""
    default_memory_mb: float = 512.0
    """What a trajectory reserves unless its action says (``TANGRAM_TRAJECTORY_MEMORY_MB``)."""
    ahead: int = 0
    """Trajectories waiting for memory before this one (all that wait, for one not queued)."""


@dataclass(frozen=True)
class Pin:
    """A new pin to store: the trajectory's node and the memory it reserves there."""

    node: str
    memory_mb: float
    stale: str | None = None
    """The node of the trajectory's old pin, gone, to drop first (its memory is given back)."""


@dataclass(frozen=True)
class MemoryWait:
    """A new trajectory that must wait, FCFS, for memory on a CPU node."""

    memory_mb: float
    cores: int
    ahead: int
    """Trajectories waiting before it."""


@dataclass(frozen=True)
class Route:
    """Where one action goes."""

    queue: str
    node: str | None = None
    """The CPU node of a CPU action; None for the other pools."""
    pin: Pin | None = None
    """The pin to store when the trajectory had none on a live node."""
    wait: MemoryWait | None = None
    """Set (and ``queue`` empty) when the trajectory waits for memory instead."""


def route(action: Action, inputs: RoutingInputs) -> Route:
    """The queue of ``action`` and, for a CPU action, its trajectory's node.

    A CPU action goes to the node its trajectory is pinned to while that node lives; otherwise
    :func:`place_now` places the trajectory and the route carries the new :class:`Pin`, unless
    others wait ahead or no live node has the memory now: then the route is a
    :class:`MemoryWait`. Raises :class:`ValidationError` or :class:`NoCapacityError` for an
    action that no pool can ever run (see :func:`check_api`, :func:`check_gpu`,
    :func:`check_cpu`, :func:`check_ever_fits`).
    """
    if action.apis():
        check_api(action, inputs.apis)
    if action.pool == "gpu":
        check_gpu(action, inputs.gpu_pool)
    if action.pool != "cpu":
        return Route(queue_for(action, None))
    alive = {view.name for view in inputs.nodes if view.alive}
    if inputs.pin is not None and inputs.pin in alive:
        return on_node(action, inputs.pin, inputs.nodes)
    memory = trajectory_memory_mb(action, inputs.default_memory_mb)
    cores = int(action.units().min)
    check_ever_fits(action, inputs.nodes, cores, memory)
    chosen = None if inputs.ahead > 0 else place_now(inputs.nodes, cores, memory)
    if chosen is None:
        return Route("", wait=MemoryWait(memory, cores, inputs.ahead))
    return dataclasses.replace(on_node(action, chosen, inputs.nodes),
                               pin=Pin(chosen, memory, stale=inputs.pin))


def on_node(action: Action, node: str, nodes: Sequence[NodeView]) -> Route:
    """The route of a CPU action to ``node``, its trajectory's, checked against the node's
    cores when ``nodes`` shows it."""
    cores = {view.name: view.cores for view in nodes}
    if node in cores:
        check_cpu(action, node, cores[node])
    return Route(queue_for(action, node), node)


def choose_node(nodes: Sequence[NodeView], cores: int, memory_mb: float) -> str:
    """Pick the node for a trajectory's first action.

    Among live nodes with enough unreserved memory for the whole trajectory, prefer the fewest
    pinned trajectories per core after placement (each trajectory is future load, which a
    heartbeat's free cores cannot show during a burst of new trajectories, nor on a node an
    autoscaler is still starting); then those with ``cores`` free now; then the lowest memory
    load after placement, then the name. Raises :class:`NoCapacityError` when no live node has
    the memory.
    """
    chosen = place_now(nodes, cores, memory_mb)
    if chosen is None:
        alive = [n.name for n in nodes if n.alive]
        raise NoCapacityError(
            f"no live CPU node has {memory_mb:g} MB free and {cores} cores for a new trajectory "
            f"(live nodes: {alive or 'none'}); start a node with `tangram worker cpu` or lower "
            "the trajectory's memory"
        )
    return chosen


def place_now(nodes: Sequence[NodeView], cores: int, memory_mb: float) -> str | None:
    """The node :func:`choose_node` picks, or None when no live node has the memory now."""
    fits = [n for n in nodes if n.alive and n.free_memory_mb >= memory_mb and n.cores >= cores]
    if not fits:
        return None
    best = min(
        fits,
        key=lambda n: (n.trajectory_load_after(), n.free_cores < cores,
                       n.memory_load_after(memory_mb), n.name),
    )
    return best.name


def check_ever_fits(action: Action, nodes: Sequence[NodeView], cores: int,
                    memory_mb: float) -> None:
    """Refuse a new trajectory that no live node could hold even empty: more memory than its
    total, or more cores than it has."""
    live = [n for n in nodes if n.alive]
    if any(n.memory_mb >= memory_mb and n.cores >= cores for n in live):
        return
    if not live:
        raise NoCapacityError(
            f"no live CPU node for trajectory {action.trajectory_id} (live nodes: none); start a "
            "node with `tangram worker cpu`"
        )
    raise NoCapacityError(
        f"no live CPU node can ever hold trajectory {action.trajectory_id}: it asks for "
        f"{memory_mb:g} MB and {cores} cores, and the largest live node has "
        f"{max(n.memory_mb for n in live):g} MB and {max(n.cores for n in live)} cores "
        f"({pool_memory(live)}); lower the trajectory's memory (trajectory_memory_mb) or cores, "
        "or start a larger node with `tangram worker cpu --memory-mb ... --cores ...`"
    )


def pool_memory(nodes: Sequence[NodeView]) -> str:
    """The live nodes' memory in words: how many, their total and what is unreserved."""
    live = [n for n in nodes if n.alive]
    total = sum(n.memory_mb for n in live)
    free = sum(max(n.free_memory_mb, 0.0) for n in live)
    largest = max((max(n.free_memory_mb, 0.0) for n in live), default=0.0)
    return (f"the pool has {len(live)} live node(s) with {total:g} MB in all, {free:g} MB "
            f"unreserved, at most {largest:g} MB on one node")


def memory_wait_error(action: Action, wait: MemoryWait, waited_s: float,
                      nodes: Sequence[NodeView]) -> str:
    """Why a trajectory that waited for memory until its action's timeout was given up."""
    return (
        f"no_capacity: trajectory {action.trajectory_id} waited {waited_s:.1f} s (its action's "
        f"timeout) for {wait.memory_mb:g} MB of memory and {wait.cores} cores on one CPU node; "
        f"{pool_memory(nodes)}. End finished trajectories (client.end_trajectory), lower the "
        "trajectory's memory, raise its timeout or add nodes"
    )


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
        return keys.gpu_queue(gpu_pool_of(action))
    apis = action.apis()
    return keys.api_queue(apis[0])


def gpu_pool_of(action: Action) -> str:
    """The GPU pool a reward action names (``payload.pool``), else the default pool."""
    return str(action.payload.get("pool", DEFAULT_GPU_POOL))


def check_cpu(action: Action, node: str, cores: int) -> None:
    """Refuse a CPU action whose minimum exceeds the cores of its trajectory's node."""
    need = int(action.units().min)
    if need > cores:
        raise NoCapacityError(
            f"action {action.id} needs at least {need} cores but trajectory "
            f"{action.trajectory_id} lives on node {node}, which has {cores}; lower the minimum "
            f"of cost.cpu to at most {cores}, or start the trajectory on a larger node"
        )


def check_gpu(action: Action, pool: GpuPoolView | None) -> None:
    """Refuse a reward action for a model the pool does not serve, or more GPUs than it has
    (no check when the pool publishes no inventory or is not alive)."""
    if pool is None or not pool.alive:
        return
    model = str(action.payload.get("model", ""))
    if pool.models and model not in pool.models:
        raise ValidationError(
            "payload.model",
            f"unknown reward model {model[:80]!r} in GPU pool {pool.name!r}; it serves "
            f"{sorted(pool.models)}",
        )
    need = int(action.units().min)
    if pool.gpus and need > pool.gpus:
        raise NoCapacityError(
            f"action {action.id} needs at least {need} GPUs but GPU pool {pool.name!r} has "
            f"{pool.gpus}; lower the minimum of cost.gpu"
        )


def check_api(action: Action, specs: Mapping[str, ApiSpec]) -> None:
    """Refuse an API amount beyond what the API can ever grant at once."""
    needs_of(action, specs)
