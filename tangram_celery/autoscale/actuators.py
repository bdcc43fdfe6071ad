"""Actuators: perform the pool sizes a :class:`~tangram_celery.autoscale.policy.Decision` sets.

One interface, :class:`Actuator`; the controller calls :meth:`Actuator.sizes` every tick and
:meth:`Actuator.scale` for each target, then :meth:`Actuator.step` to move drains along.

* :class:`LocalProcessActuator` (the embedded default): ``tangram worker cpu`` subprocesses on
  this machine, one per CPU pool member;
* :class:`DockerActuator`: the same members as containers (``docker`` SDK), labelled
  ``tangram.pool``, optionally as replicas of a compose service;
* :class:`KubernetesActuator`: the ``scale`` subresource of Deployments / StatefulSets (official
  ``kubernetes`` client), the path to many hosts;
* :class:`ActAwareAutoscaler`: inside one prefork worker, Celery's own autoscaler hook sized by
  the same policy.

**Draining a CPU node.** A trajectory is pinned to the node that holds its environment, so a node
cannot simply be killed. Scaling down picks the member with the fewest pinned trajectories and
drains it:

1. it stops taking *new* trajectories: the actuator sets the node's advertised ``memory_mb`` to 0
   in its registry hash, so :func:`tangram_celery.pools.routing.choose_node` never picks it, while
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
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import redis
from celery.worker.autoscale import Autoscaler
from docker import errors as docker_errors

from tangram_celery import keys
from tangram_celery.autoscale.policy import Budget, PoolLimits, PoolLoad, ScalingConfig, decide
from tangram_celery.autoscale.work import Work, action_work
from tangram_celery.pools.launch import spawn_cpu_worker
from tangram_celery.pools.registry import Registry
from tangram_celery.processes import stop_process

log = logging.getLogger(__name__)

CPU_POOL = "cpu"


class Actuator(Protocol):
    """Something that can report and change pool sizes (in members)."""

    def sizes(self) -> dict[str, int]:
        """Members per pool that take new work now (draining members excluded)."""

    def scale(self, pool: str, target: int) -> None:
        """Start moving ``pool`` to ``target`` members (may return before it is done)."""

    def step(self) -> None:
        """Move pending work along (finish drains); called once per tick."""

    def close(self) -> None:
        """Stop everything this actuator started."""


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


class LocalProcessActuator(MemberActuator):
    """CPU node workers as local ``tangram worker cpu`` subprocesses (the embedded default)."""

    def __init__(
        self, client: redis.Redis, env: Mapping[str, str], cores: int, memory_mb: float,
        log_dir: Path, prefix: str = "auto", drain_timeout_s: float = 600.0,
        clock: Callable[[], float] = time.time, *, registry: Registry | None = None,
        startup_grace_s: float = 30.0,
    ) -> None:
        super().__init__(client, cores, memory_mb, prefix, drain_timeout_s, clock,
                         registry=registry, startup_grace_s=startup_grace_s)
        self._env = dict(env)
        self._log_dir = log_dir

    def _start(self, name: str) -> subprocess.Popen[bytes]:
        return spawn_cpu_worker(self._env, name, self.cores, self._log_dir / f"{name}.log",
                                extra_args=["--memory-mb", f"{self.memory_mb:g}"])

    def _stop(self, handle: object) -> None:
        assert isinstance(handle, subprocess.Popen)
        stop_process(handle)

    def _exited(self, handle: object) -> bool:
        assert isinstance(handle, subprocess.Popen)
        return handle.poll() is not None


@dataclass(frozen=True)
class ContainerTemplate:
    """How the Docker actuator starts one CPU node container.

    ``command`` items may use ``{name}``, ``{cores}`` and ``{memory_mb}``; every container gets
    ``labels`` plus ``tangram.pool`` and ``tangram.member``. To show up as replicas of a compose
    service, put ``com.docker.compose.project`` / ``com.docker.compose.service`` in ``labels``.
    """

    image: str
    command: tuple[str, ...] = ("tangram", "worker", "cpu", "--node", "{name}", "--cores",
                                "{cores}", "--memory-mb", "{memory_mb}")
    environment: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    network_mode: str = "host"
    stop_timeout_s: int = 30

    def argv(self, name: str, cores: int, memory_mb: float) -> list[str]:
        """The container's command for member ``name``."""
        return [part.format(name=name, cores=cores, memory_mb=f"{memory_mb:g}")
                for part in self.command]


class DockerActuator(MemberActuator):
    """CPU node workers as containers started with the ``docker`` SDK, labelled
    ``tangram.pool=cpu``; drained like local processes before they are stopped and removed."""

    def __init__(
        self, client: redis.Redis, docker_client: Any, template: ContainerTemplate, cores: int,
        memory_mb: float, prefix: str = "auto", drain_timeout_s: float = 600.0,
        clock: Callable[[], float] = time.time, *, registry: Registry | None = None,
        startup_grace_s: float = 30.0,
    ) -> None:
        super().__init__(client, cores, memory_mb, prefix, drain_timeout_s, clock,
                         registry=registry, startup_grace_s=startup_grace_s)
        self._docker = docker_client
        self.template = template

    def containers(self) -> list[Any]:
        """Every container of this actuator's prefix in the CPU pool, running or not."""
        return list(self._docker.containers.list(all=True, filters={"label": [
            f"tangram.pool={CPU_POOL}", f"tangram.prefix={self._prefix}"]}))

    def _start(self, name: str) -> Any:
        labels = {**self.template.labels, "tangram.pool": CPU_POOL, "tangram.member": name,
                  "tangram.prefix": self._prefix}
        return self._docker.containers.run(
            self.template.image, self.template.argv(name, self.cores, self.memory_mb),
            name=f"tangram-{name}", detach=True, labels=labels,
            environment=dict(self.template.environment), network_mode=self.template.network_mode,
            nano_cpus=self.cores * 1_000_000_000,
        )

    def _stop(self, handle: object) -> None:
        container: Any = handle
        with contextlib.suppress(docker_errors.NotFound):
            container.stop(timeout=self.template.stop_timeout_s)
            container.remove(force=True)

    def _exited(self, handle: object) -> bool:
        container: Any = handle
        try:
            container.reload()
        except docker_errors.NotFound:
            return True
        return str(container.status) in {"exited", "dead"}


@dataclass(frozen=True)
class Workload:
    """A Kubernetes workload running one pool's members: ``kind`` is ``deployment`` or
    ``statefulset``."""

    kind: str
    name: str
    namespace: str = "default"


class KubernetesActuator:
    """Pools as Kubernetes Deployments or StatefulSets, scaled through their ``scale``
    subresource with the official ``kubernetes`` client: the path to many hosts.

    A pool's size is its ``spec.replicas``. Growing patches it at once. For a CPU pool on a
    **StatefulSet** whose pods run ``tangram worker cpu --node $(POD_NAME)`` (pod ``<name>-<i>``
    is node ``<name>-<i>``), shrinking first drains the nodes Kubernetes will remove (the highest
    ordinals) and patches the replicas down only once they are drained (or after
    ``drain_timeout_s``), so no pinned trajectory loses its environment. A Deployment removes
    pods of its own choosing: it is patched at once, and its pods need a ``preStop`` hook and a
    long ``terminationGracePeriodSeconds`` instead.
    """

    def __init__(
        self, apps_api: Any, workloads: Mapping[str, Workload], drain: NodeDrain | None = None,
        node_memory_mb: float = 8192.0, drain_timeout_s: float = 600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._apps = apps_api
        self.node_memory_mb = node_memory_mb
        self.workloads = dict(workloads)
        self._drain = drain
        self.drain_timeout_s = drain_timeout_s
        self._clock = clock
        self._pending: dict[str, tuple[int, float]] = {}

    def sizes(self) -> dict[str, int]:
        """``spec.replicas`` of every pool's workload (less the replicas being drained)."""
        return {pool: self._pending[pool][0] if pool in self._pending else self._replicas(pool)
                for pool in self.workloads}

    def scale(self, pool: str, target: int) -> None:
        """Patch the replicas (growing, or a Deployment), else start draining the tail."""
        workload = self.workloads.get(pool)
        if workload is None:
            log.warning("no Kubernetes workload for pool %s; ignored", pool)
            return
        current = self._replicas(pool)
        if pool in self._pending:
            self._cancel_drains(workload, self._pending.pop(pool)[0], min(current, target))
        if target >= current or workload.kind != "statefulset" or self._drain is None:
            self._patch(pool, target)
            return
        for ordinal in range(target, current):
            self._drain.begin(f"{workload.name}-{ordinal}")
        self._pending[pool] = (target, self._clock())

    def step(self) -> None:
        """Patch a StatefulSet down once the nodes it will remove are drained."""
        for pool, (target, since) in list(self._pending.items()):
            workload = self.workloads[pool]
            tail = [f"{workload.name}-{i}" for i in range(target, self._replicas(pool))]
            late = self._clock() - since > self.drain_timeout_s
            if late or all(self._drain is not None and self._drain.done(n) for n in tail):
                self._patch(pool, target)
                del self._pending[pool]

    def close(self) -> None:
        """Nothing to stop: the workloads stay as they are."""

    def _cancel_drains(self, workload: Workload, low: int, high: int) -> None:
        for ordinal in range(low, high):
            if self._drain is not None:
                self._drain.cancel(f"{workload.name}-{ordinal}", self.node_memory_mb)

    def _replicas(self, pool: str) -> int:
        workload = self.workloads[pool]
        read = (self._apps.read_namespaced_stateful_set_scale if workload.kind == "statefulset"
                else self._apps.read_namespaced_deployment_scale)
        return int(read(workload.name, workload.namespace).spec.replicas or 0)

    def _patch(self, pool: str, replicas: int) -> None:
        workload = self.workloads[pool]
        patch = (self._apps.patch_namespaced_stateful_set_scale
                 if workload.kind == "statefulset"
                 else self._apps.patch_namespaced_deployment_scale)
        patch(workload.name, workload.namespace, {"spec": {"replicas": replicas}})
        log.info("patched %s/%s replicas to %d", workload.kind, workload.name, replicas)


class ActAwareAutoscaler(Autoscaler):  # type: ignore[misc]
    """A custom Celery autoscaler sizing a prefork pool by predicted work, not message count.

    Use it with both ``worker_autoscaler =
    "tangram_celery.autoscale.actuators:ActAwareAutoscaler"`` and ``--autoscale=max,min``
    (the setting alone does nothing), and only with the prefork pool (``-P threads`` crashes at
    start). Celery calls :attr:`qty` on every task message and every ``keepalive`` seconds; here
    it is the :func:`~tangram_celery.autoscale.policy.decide` target for a one-process-per-unit
    pool whose running actions are the active requests and whose queued work is the expected
    duration of the reserved (prefetched) ones. ``tangram_autoscale_target_wait_s`` in the app's
    configuration sets the target wait (default 2 s). Celery's own ``keepalive`` still delays
    every shrink. The node scheduler still decides core allocations; this only sizes the pool.
    """

    @property
    def qty(self) -> int:
        """Processes wanted now."""
        from celery.worker import state

        reserved = list(state.reserved_requests)
        active = len(state.active_requests)
        work = [action_work(request.args[0] if request.args else None) for request in reserved
                if request not in state.active_requests]
        return worker_target(self.processes, active, work, self.min_concurrency,
                             self.max_concurrency, self._target_wait_s())

    def _target_wait_s(self) -> float:
        conf = getattr(getattr(self.worker, "app", None), "conf", None)
        value = conf.get("tangram_autoscale_target_wait_s") if conf is not None else None
        return float(value) if value else ScalingConfig().target_wait_s


def worker_target(processes: int, active: int, queued: Sequence[Work], minimum: int,
                  maximum: int, target_wait_s: float) -> int:
    """The pure core of :class:`ActAwareAutoscaler`: the policy's target for one worker pool."""
    load = PoolLoad(
        pool="worker", resource="process", member_units=1, size=processes, running=active,
        prefetched=len(queued), running_units=active,
        predicted_work_s=sum(w.seconds for w in queued), unknown=sum(w.unknown for w in queued),
    )
    limits = {"worker": PoolLimits(minimum, maximum)}
    config = ScalingConfig(target_wait_s=target_wait_s, down_hold_s=0.0)
    return decide([load], Budget({}, limits), config).targets[0].target
