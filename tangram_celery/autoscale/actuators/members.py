"""The CPU pool as members (a worker each) that are drained before they stop.

:class:`MemberActuator` keeps the members, their drain state and the resource-seconds they held;
its subclasses say how a member starts, stops and is seen to have exited.

**Draining a CPU node.** A trajectory is pinned to the node that holds its environment, so a node
cannot simply be killed. Scaling down picks the member with the fewest pinned trajectories and
drains it:

1. it stops taking *new* trajectories: the actuator sets the node's advertised ``memory_mb`` to 0
   in its registry hash, so :func:`tangram_celery.client.routing.choose_node` never picks it, while
   trajectories already pinned there keep their pin (the heartbeat refreshes only
   ``heartbeat`` and ``free_cores``);
2. it keeps serving its pinned trajectories until every one has ended (its
   ``keys.node_trajectories`` set is empty), its queue is empty and no core is allocated, or until
   ``drain_timeout_s`` has passed;
3. then the worker gets SIGTERM (Celery's warm shutdown finishes running tasks) and deregisters.

A draining member still counts as held (its resource-seconds are charged) but not as pool size.
When the pool grows again, a draining member is taken back first (its ``memory_mb`` restored),
which is cheaper than a cold start. New members receive new trajectories through the router's
memory balancing (an empty node has the lowest memory load).

GPU pools are not scaled by this actuator: a GPU pool worker publishes one hash per pool name,
so two workers of one pool would overwrite each other's inventory; resizing a GPU pool needs a
restart with another ``--gpus`` (future work).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from tangram_celery import keys
from tangram_celery.autoscale.actuators.interface import CPU_POOL
from tangram_celery.pools.registry import Registry

log = logging.getLogger(__name__)

RESTART_BACKOFF_S = 5.0
"""Shortest time between two starts of the same member."""


@dataclass
class Member:
    """One worker of a pool (a local process, a container) and its drain state."""

    name: str
    cores: int
    handle: object
    started: float
    memory_mb: float
    draining_since: float | None = None


@dataclass
class HeldClock:
    """Resource-seconds held: units times seconds, for every member since its start."""

    closed: float = 0.0
    open_: dict[str, tuple[float, int]] = field(default_factory=dict)

    def start(self, name: str, units: int, now: float) -> None:
        """A member holding ``units`` starts at ``now``."""
        self.open_[name] = (now, units)

    def stop(self, name: str, now: float) -> None:
        """The member stops holding at ``now``."""
        begun, units = self.open_.pop(name, (now, 0))
        self.closed += units * (now - begun)

    def total(self, now: float) -> float:
        """Unit-seconds held up to ``now``."""
        return self.closed + sum(u * (now - t) for t, u in self.open_.values())


class NodeDrain:
    """The registry side of draining a CPU node (see the module docstring)."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def begin(self, name: str) -> None:
        """Stop routing new trajectories to ``name`` (its advertised memory becomes 0)."""
        self._redis.hset(keys.node(name), "memory_mb", 0)

    def cancel(self, name: str, memory_mb: float) -> None:
        """Take a draining node back: advertise its memory again."""
        self._redis.hset(keys.node(name), "memory_mb", memory_mb)

    def pinned(self, name: str) -> int:
        """Trajectories still pinned to ``name``."""
        return int(self._redis.scard(keys.node_trajectories(name)))

    def done(self, name: str) -> bool:
        """No pinned trajectory, no allocated core, nothing left in its queue."""
        if self.pinned(name):
            return False
        raw = self._redis.hmget(keys.node(name), ["cores", "free_cores"])
        cores, free = (int(float(v)) if v is not None else 0 for v in raw)
        return free >= cores and not self._redis.llen(keys.cpu_queue(name))

    def forget(self, name: str) -> None:
        """Drop a stopped node from the node set."""
        with contextlib.suppress(redis.RedisError):
            self._redis.srem(keys.NODES, name)


class MemberActuator:
    """The CPU pool as members named ``<prefix>-<n>`` of ``cores`` cores, drained before they
    stop. Subclasses say how a member starts, stops and is seen to have exited."""

    def __init__(
        self, client: redis.Redis, cores: int, memory_mb: float, prefix: str = "auto",
        drain_timeout_s: float = 600.0, clock: Callable[[], float] = time.time, *,
        registry: Registry | None = None, startup_grace_s: float = 30.0,
    ) -> None:
        """With a ``registry``, a member is announced as soon as it is started (alive for
        ``startup_grace_s`` until its worker registers), so new trajectories go to it at once."""
        self.cores = cores
        self._registry = registry
        self._startup_grace_s = startup_grace_s
        self.memory_mb = memory_mb
        self.drain_timeout_s = drain_timeout_s
        self._drain = NodeDrain(client)
        self._prefix = prefix
        self._clock = clock
        self._members: dict[str, Member] = {}
        self._serial = 0
        self.held = HeldClock()

    def sizes(self) -> dict[str, int]:
        """Members of the CPU pool that take new trajectories."""
        return {CPU_POOL: len(self.active())}

    def active(self) -> list[Member]:
        """Members not draining, oldest first."""
        return [m for m in self._members.values() if m.draining_since is None]

    def draining(self) -> list[Member]:
        """Members being drained."""
        return [m for m in self._members.values() if m.draining_since is not None]

    def scale(self, pool: str, target: int) -> None:
        """Grow by taking drains back, then by starting members; shrink by draining the members
        with the fewest pinned trajectories."""
        if pool != CPU_POOL:
            log.warning("%s does not scale pool %s (CPU only); ignored", type(self).__name__,
                        pool)
            return
        while len(self.active()) < target:
            self._grow_one()
        surplus = len(self.active()) - target
        for member in sorted(self.active(), key=lambda m: self._drain.pinned(m.name))[:surplus]:
            member.draining_since = self._clock()
            self._drain.begin(member.name)
            log.info("draining node %s (%d pinned trajectories)", member.name,
                     self._drain.pinned(member.name))

    def step(self) -> None:
        """Start again, under the same name, active members that exited (their queue and pinned
        trajectories are served again), at most once per ``RESTART_BACKOFF_S`` each; stop
        drained members whose trajectories ended (or whose drain timed out)."""
        now = self._clock()
        for member in self.active():
            if self._exited(member.handle) and now - member.started >= RESTART_BACKOFF_S:
                log.warning("node %s exited; starting it again", member.name)
                member.handle = self._launch(member.name)
                member.started = now
        for member in self.draining():
            done = self._drain.done(member.name)
            late = now - (member.draining_since or now) > self.drain_timeout_s
            if done or late or self._exited(member.handle):
                log.info("stopping drained node %s (%s)", member.name,
                         "drained" if done else "drain timeout" if late else "exited")
                self._remove(member)

    def close(self) -> None:
        """Stop every member at once (no drain)."""
        for member in list(self._members.values()):
            self._remove(member)

    def _grow_one(self) -> None:
        if self.draining():
            member = max(self.draining(), key=lambda m: m.started)
            self._drain.cancel(member.name, member.memory_mb)
            member.draining_since = None
            log.info("node %s taken back from draining", member.name)
            return
        self._serial += 1
        name = f"{self._prefix}-{self._serial}"
        handle = self._launch(name)
        now = self._clock()
        self._members[name] = Member(name, self.cores, handle, now, self.memory_mb)
        self.held.start(name, self.cores, now)
        log.info("started node %s (%d cores)", name, self.cores)

    def _launch(self, name: str) -> object:
        handle = self._start(name)
        if self._registry is not None:
            self._registry.announce_node(name, self.cores, self.memory_mb, self._startup_grace_s)
        return handle

    def _remove(self, member: Member) -> None:
        self._stop(member.handle)
        self.held.stop(member.name, self._clock())
        self._drain.forget(member.name)
        del self._members[member.name]

    def _start(self, name: str) -> object:
        raise NotImplementedError

    def _stop(self, handle: object) -> None:
        raise NotImplementedError

    def _exited(self, handle: object) -> bool:
        raise NotImplementedError
