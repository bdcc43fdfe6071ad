"""The routing decision's Redis edge: gather its inputs, decide once, store the pin it chose.

For each submitted action the :class:`Router` reads what :func:`~.routing.route` needs (the
trajectory's pin and the CPU nodes, or the GPU pool's published view), calls it once, and then
stores the new pin, if the decision made one. Reads are cached briefly, as a training loop
submits many actions of one trajectory in a row: a pin for ``PIN_CACHE_S`` (a trajectory's
actions then cost no Redis read), the node views until an action needs more cores than they
show for its node, a GPU pool's view for ``GPU_POOL_CACHE_S``.

Pinning is atomic in Redis. When another client pinned the same trajectory between this one's
read and its write, the other client's node wins and the action is routed there instead. A new
trajectory is pinned only if it is first in the shared line of those waiting for memory and its
node still has the memory (:class:`~tangram_celery.client.tickets.MemoryTickets`); otherwise its
route is a :class:`~tangram_celery.client.routing.MemoryWait` and it holds a ticket in that line.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from typing import Any

import redis

from tangram_celery import keys
from tangram_celery.action import Action
from tangram_celery.client.routing import (
    MemoryWait,
    Route,
    RoutingInputs,
    gpu_pool_of,
    on_node,
    route,
    trajectory_memory_mb,
)
from tangram_celery.client.tickets import MemoryTickets, Placement
from tangram_celery.managers.basic import parse_api_limits
from tangram_celery.pools.inventory import GpuPoolView, gpu_pool_view
from tangram_celery.pools.registry import NodeView, Registry
from tangram_celery.settings import Settings
from tangram_celery.tasks.clock import broker_time

PIN_CACHE_S = 1.0
GPU_POOL_CACHE_S = 5.0


class Router:
    """Routes actions with :func:`~.routing.route` over what one Redis holds."""

    def __init__(self, client: redis.Redis, settings: Settings,
                 pin_cache_s: float = PIN_CACHE_S, client_id: str | None = None) -> None:
        self.registry = Registry(client, settings.node.ttl_s, settings.actions.trajectory_ttl_s)
        self.tickets = MemoryTickets(client, settings.actions.trajectory_ttl_s,
                                     client_id or uuid.uuid4().hex)
        self.dropped: list[dict[str, Any]] = []
        """Tickets of dead clients this router dropped, not yet answered (see tickets)."""
        self._lock = threading.Lock()
        self._redis = client
        self._node_ttl_s = settings.node.ttl_s
        self._pin_cache_s = pin_cache_s
        self._base = RoutingInputs(apis=parse_api_limits(settings.api.limits),
                                   default_memory_mb=settings.actions.trajectory_memory_mb)
        self._pins: dict[str, tuple[str, float]] = {}
        self._nodes: tuple[NodeView, ...] = ()
        self._gpu_pools: dict[str, tuple[GpuPoolView | None, float]] = {}

    def route(self, action: Action) -> Route:
        """The route of ``action``, its trajectory pinned in Redis when it had no live pin.

        A route with ``wait`` set means the trajectory now holds a ticket in the line of those
        waiting for memory. Raises what :func:`~.routing.route` raises, and
        ``redis.RedisError`` when Redis does not answer. Thread-safe.
        """
        with self._lock:
            inputs, read_pin = self._gather(action)
            decided = route(action, inputs)
            if decided.wait is not None:
                return self._wait(action, inputs, decided.wait)
            if decided.pin is None:
                if read_pin:
                    self.registry.refresh_pin(action.trajectory_id)
                return decided
            return self._store_pin(action, inputs, decided)

    def memory_wait(self, action: Action) -> MemoryWait:
        """What a new trajectory of ``action`` waits for (nobody counted ahead)."""
        memory = trajectory_memory_mb(action, self._base.default_memory_mb)
        return MemoryWait(memory, int(action.units().min), 0)

    def forget(self, trajectory_id: str) -> None:
        """Drop the cached pin of a trajectory that ended."""
        self._pins.pop(trajectory_id, None)

    def _gather(self, action: Action) -> tuple[RoutingInputs, bool]:
        """The decision's inputs for ``action``, and whether its pin was read from Redis now."""
        if action.pool == "gpu":
            pool = self._gpu_pool(gpu_pool_of(action))
            return dataclasses.replace(self._base, gpu_pool=pool), False
        if action.pool != "cpu":
            return self._base, False
        cached = self._pins.get(action.trajectory_id)
        if cached is not None and time.monotonic() - cached[1] < self._pin_cache_s:
            if self._cores(cached[0]) < action.units().min:
                self._nodes = tuple(self.registry.nodes())
            return self._with_line(action, cached[0]), False
        pin = self.registry.pinned_node(action.trajectory_id)
        self._nodes = tuple(self.registry.nodes())
        if pin is not None:
            self._pins[action.trajectory_id] = (pin, time.monotonic())
        return self._with_line(action, pin), pin is not None

    def _with_line(self, action: Action, pin: str | None) -> RoutingInputs:
        """The inputs of a CPU action; the memory line is read only when it needs placing."""
        inputs = dataclasses.replace(self._base, nodes=self._nodes, pin=pin)
        if pin is not None and any(v.name == pin and v.alive for v in self._nodes):
            return inputs
        return dataclasses.replace(inputs, ahead=self.tickets.ahead(action.trajectory_id))

    def _store_pin(self, action: Action, inputs: RoutingInputs, decided: Route) -> Route:
        assert decided.pin is not None
        trajectory = action.trajectory_id
        if decided.pin.stale is not None:
            self.registry.unpin(trajectory)
        placed = self._place(action, decided.pin.node, decided.pin.memory_mb)
        if placed.node is None:
            return Route("", wait=MemoryWait(decided.pin.memory_mb, int(action.units().min),
                                             placed.ahead))
        self._pins[trajectory] = (placed.node, time.monotonic())
        if placed.node == decided.pin.node:
            return decided
        return on_node(action, placed.node, inputs.nodes)

    def _wait(self, action: Action, inputs: RoutingInputs, wait: MemoryWait) -> Route:
        """Queue the trajectory; when the line shrank to it meanwhile (dead clients' tickets
        were dropped), decide once more as its head."""
        queued = self._queue(action, inputs, wait)
        if queued.wait is None or queued.wait.ahead > 0 or wait.ahead == 0:
            return queued
        again = route(action, dataclasses.replace(inputs, pin=None, ahead=0))
        return queued if again.pin is None else self._store_pin(action, inputs, again)

    def _queue(self, action: Action, inputs: RoutingInputs, wait: MemoryWait) -> Route:
        """Hold (or keep) the trajectory's ticket in the memory line; a pin another client
        stored meanwhile routes it there instead."""
        if inputs.pin is not None:
            self.registry.unpin(action.trajectory_id)
        placed = self._place(action, None, wait.memory_mb)
        if placed.node is not None:
            self._pins[action.trajectory_id] = (placed.node, time.monotonic())
            return on_node(action, placed.node, self._nodes)
        return Route("", wait=dataclasses.replace(wait, ahead=placed.ahead))

    def _place(self, action: Action, node: str | None, memory_mb: float) -> Placement:
        placed = self.tickets.place(action.trajectory_id, node, memory_mb, [action.id])
        self.dropped.extend(placed.dropped)
        return placed

    def _cores(self, node: str) -> int:
        return next((view.cores for view in self._nodes if view.name == node), 0)

    def _gpu_pool(self, name: str) -> GpuPoolView | None:
        """What GPU pool ``name`` publishes (cached a few seconds), if anything."""
        cached = self._gpu_pools.get(name)
        now = time.monotonic()
        if cached is not None and now - cached[1] < GPU_POOL_CACHE_S:
            return cached[0]
        raw = self._redis.hgetall(keys.gpu_pool(name))
        view = gpu_pool_view(name, raw, broker_time(self._redis), self._node_ttl_s) if raw else None
        self._gpu_pools[name] = (view, now)
        return view
