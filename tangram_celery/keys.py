"""Every queue name and Redis key of tangram-celery, in one place.

Functions take already-validated identifiers (see :mod:`tangram_celery.action`).
"""

from __future__ import annotations

PREFIX = "tangram"

# Celery task names, one per action kind so Flower shows readable names.
TASK_PREFIX = "tangram.action."
ACTION_KINDS = ("exec", "test_run", "reward", "api")


def task_name(kind: str) -> str:
    """The Celery task name that runs actions of ``kind``."""
    return f"{TASK_PREFIX}{kind}"


def cpu_queue(node: str) -> str:
    """The FCFS queue of one CPU node."""
    return f"{PREFIX}.cpu.{node}"


def cpu_node_of_queue(queue: str) -> str | None:
    """The CPU node whose queue is ``queue`` (None for any other queue)."""
    prefix = cpu_queue("")
    return queue[len(prefix):] if queue.startswith(prefix) and len(queue) > len(prefix) else None


DEFAULT_GPU_POOL = "default"
"""The GPU pool of a reward action whose payload names none."""


def gpu_queue(pool: str) -> str:
    """The FCFS queue of one GPU reward pool."""
    return f"{PREFIX}.gpu.{pool}"


def api_queue(api: str) -> str:
    """The FCFS queue of the basic (quota-limited) pool of one API."""
    return f"{PREFIX}.api.{api}"


def control_queue() -> str:
    """The queue of housekeeping tasks (trajectory end, reaping)."""
    return f"{PREFIX}.control"


NODES = f"{PREFIX}:nodes"


def node(name: str) -> str:
    """Hash describing a live CPU node: cores, memory, free cores, reserved memory, heartbeat."""
    return f"{PREFIX}:node:{name}"


def node_allocations(name: str) -> str:
    """List of the node's closed allocations (action id, units, start, end), newest first."""
    return f"{PREFIX}:node:{name}:allocations"


def trajectory_pin(trajectory_id: str) -> str:
    """String: the CPU node a trajectory is pinned to."""
    return f"{PREFIX}:traj:{trajectory_id}:node"


def trajectory_memory(trajectory_id: str) -> str:
    """String: the memory (MB) a trajectory reserved on its node."""
    return f"{PREFIX}:traj:{trajectory_id}:mem"


def node_trajectories(name: str) -> str:
    """Set of the trajectories pinned to a node."""
    return f"{PREFIX}:node:{name}:trajectories"


def action_result(action_id: str) -> str:
    """String: the stored result of an action (idempotency record)."""
    return f"{PREFIX}:result:{action_id}"


def durations(signature: str) -> str:
    """Online duration model state of one action signature."""
    return f"{PREFIX}:durations:{signature}"


CPU = "cpu"
GPU = "gpu"
"""The pool types that each share one duration log."""


def duration_log(pools: str = CPU) -> str:
    """The stream of the finished actions (signature, units, seconds) of every worker of pool
    type ``pools`` (CPU nodes, GPU pools) that their duration models learn from."""
    return f"{PREFIX}:duration-log" if pools == CPU else f"{PREFIX}:duration-log:{pools}"


def api_tokens(api: str) -> str:
    """Token bucket state of one API (basic manager)."""
    return f"{PREFIX}:api:{api}:bucket"


def api_leases(api: str) -> str:
    """Sorted set of concurrency leases of one API, scored by expiry time (basic manager)."""
    return f"{PREFIX}:api:{api}:leases"


def api_tickets(api: str) -> str:
    """Sorted set of the actions waiting for one API, scored by their place in the order
    (`scheduling.ordering.trajectory_order_key`; basic manager)."""
    return f"{PREFIX}:api:{api}:tickets"


def api_ticket_deadlines(api: str) -> str:
    """Sorted set of the same waiting tickets scored by expiry, renewed while they wait."""
    return f"{PREFIX}:api:{api}:ticket-deadlines"


def api_trajectory_seen(trajectory_id: str) -> str:
    """When the basic manager first queued an API call of a trajectory (its place in the order),
    kept while the trajectory keeps calling."""
    return f"{PREFIX}:api:trajectory:{trajectory_id}:first-seen"


def action_attempts(action_id: str) -> str:
    """Counter of how many times a worker started an action (redeliveries included)."""
    return f"{PREFIX}:attempts:{action_id}"


def action_claim(action_id: str) -> str:
    """String: the delivery that holds an action's claim to run it (see tasks.ledger)."""
    return f"{PREFIX}:claim:{action_id}"


DEAD_LETTERS = f"{PREFIX}:deadletter"
DUPLICATE_RESULTS = f"{PREFIX}:stats:duplicate-results"
REPUBLISHED_ACTIONS = f"{PREFIX}:stats:republished-actions"
"""Counter of actions a client found lost in transit and published again
(:mod:`tangram_celery.client.recovery`)."""

# Monitoring (see tangram_celery.tasks.actlog, tangram_celery.pools.inventory).
METRICS_ACTS = f"{PREFIX}:metrics:acts"
"""Capped stream: one compact ACT record per executed action, appended by workers and read by
``tangram exporter`` (fields: see :func:`tangram_celery.tasks.actlog.act_record`)."""

GPU_POOLS = f"{PREFIX}:gpu:pools"
"""Set of the GPU pools that publish their inventory (see :func:`gpu_pool`)."""


def gpu_pool(name: str) -> str:
    """Hash a GPU pool worker publishes about itself, read by ``tangram status`` and the exporter.

    Fields (all optional but ``gpus``): ``gpus`` and ``free_gpus`` (ints), ``heartbeat`` (epoch
    seconds), ``worker`` (its Celery node name), ``models`` (JSON list of the reward models it
    serves) and ``residents`` (JSON list of ``{"model": str, "gpus": [int, ...]}``).
    """
    return f"{PREFIX}:gpu:pool:{name}"

AUTOSCALE_POOLS = f"{PREFIX}:autoscale:pools"
"""Set of the pools the autoscaler sizes (see :func:`autoscale_pool`)."""


def autoscale_pool(pool: str) -> str:
    """Hash the autoscaler publishes per pool each tick: ``target`` and ``actual`` (members),
    ``units`` (per member), ``action`` (up/down/hold), ``reason`` and ``at`` (epoch seconds)."""
    return f"{PREFIX}:autoscale:pool:{pool}"

# Trajectories waiting for memory on a CPU node (see tangram_celery.client.tickets).
MEMORY_TICKETS = f"{PREFIX}:memory:tickets"
"""Sorted set of the trajectories waiting for memory, scored by their place in line (FCFS across
every client)."""
MEMORY_TICKET_LEASES = f"{PREFIX}:memory:ticket-leases"
"""Sorted set of the same trajectories scored by when their lease ends (Redis' clock); the
waiting client renews it, and a ticket whose client stopped renewing is dropped."""
MEMORY_TICKET_SEQ = f"{PREFIX}:memory:ticket-seq"
"""Counter handing out places in line."""
MEMORY_TICKET_INFO = f"{PREFIX}:memory:ticket-info"
"""Hash: waiting trajectory -> JSON of its ticket (action ids, memory, client, since)."""
MEMORY_ADMISSIONS = f"{PREFIX}:memory:admissions"
"""Capped list, newest first: JSON of each trajectory placed after waiting (place, waited s)."""
MEMORY_ABANDONED = f"{PREFIX}:memory:abandoned"
"""Capped list, newest first: JSON of the tickets dropped because their client stopped renewing
them (it died); their actions were answered ``client_lost``."""

GATEWAYS = f"{PREFIX}:gateways"
"""Hash: gateway name -> JSON of what a running ``tangram gateway`` serves (``address``,
``served``, ``in_flight``, ``at`` epoch seconds), renewed every few seconds and read by
``tangram status`` (see :mod:`tangram_celery.observe.gateways`)."""
