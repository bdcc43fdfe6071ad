"""``tangram autoscaler``: the tick loop that sizes pools.

Each tick gathers all I/O once (queue depths with priority sub-lists and unacked messages, the
work predicted for the queued messages, recent ACT parts from the ACT stream, the actuator's
sizes, the clock), calls the pure :func:`~tangram_celery.autoscale.policy.decide`, hands the
targets to the :class:`~tangram_celery.autoscale.actuators.Actuator`, logs every decision and
publishes each pool's target and actual size to Redis (``keys.autoscale_pool``) for the exporter.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from tangram_celery import keys
from tangram_celery.autoscale.actuators.interface import CPU_POOL, Actuator
from tangram_celery.autoscale.actuators.kubernetes import (
    KubernetesActuator,
    Workload,
    cluster_apps_api,
)
from tangram_celery.autoscale.actuators.local import LocalProcessActuator
from tangram_celery.autoscale.actuators.members import NodeDrain
from tangram_celery.autoscale.policy import (
    Budget,
    Decision,
    PoolLimits,
    PoolLoad,
    ScalingConfig,
    decide,
)
from tangram_celery.autoscale.work import Work, messages_work, unacked_work
from tangram_celery.connection import connect
from tangram_celery.errors import ServiceError
from tangram_celery.pools.inventory import Inventory, priority_lists, read_inventory
from tangram_celery.pools.registry import Registry
from tangram_celery.settings import AutoscaleSettings, Settings
from tangram_celery.tasks.actlog import ActRecord
from tangram_celery.tasks.app import celery_config

log = logging.getLogger(__name__)

PEEK_LIMIT = 2000
ACT_WINDOW_S = 30.0
ACT_SCAN = 2000


@dataclass(frozen=True)
class RecentAct:
    """Mean ACT parts of a pool's recent actions."""

    queue_s: float = 0.0
    exec_s: float = 0.0
    count: int = 0


@dataclass(frozen=True)
class AutoscalerOptions:
    """What ``tangram autoscaler`` needs beyond :class:`Settings` (see :func:`add_arguments`)."""

    interval_s: float = 1.0
    node_cores: int = 2
    node_memory_mb: float = 8192.0
    min_nodes: int = 1
    max_nodes: int = 8
    budget_cores: int = 0
    drain_timeout_s: float = 600.0
    scaling: ScalingConfig = field(default_factory=ScalingConfig)

    def budget(self) -> Budget:
        """The budget of the CPU pool (``budget_cores`` 0: unlimited)."""
        totals = {"cpu": self.budget_cores} if self.budget_cores > 0 else {}
        return Budget(totals, {CPU_POOL: PoolLimits(self.min_nodes, self.max_nodes)})


def recent_act(records: Iterable[ActRecord], pool: str, since: float) -> RecentAct:
    """Mean queueing and execution time of ``pool``'s actions finished after ``since``."""
    mine = [r for r in records if r.pool == pool and r.at >= since]
    if not mine:
        return RecentAct()
    return RecentAct(sum(r.queue_s for r in mine) / len(mine),
                     sum(r.exec_s for r in mine) / len(mine), len(mine))


def cpu_load(
    inventory: Inventory, ready: Work, unacked: Work, recent: RecentAct, size: int,
    member_units: int, since_scale_s: float, member_memory_mb: float = 0.0,
) -> PoolLoad:
    """The CPU pool's :class:`PoolLoad` from one tick's readings.

    Running units are the allocated cores of live nodes; prefetched messages are the unacked ones
    beyond one per allocated core (exact for single-core actions, an upper bound otherwise).
    Memory is what live nodes have reserved plus what the memory line asks for.
    """
    live = [n for n in inventory.nodes if n.alive]
    running_units = sum(max(n.cores - n.free_cores, 0) for n in live)
    unacked_count = sum(q.unacked for q in inventory.queues if q.pool == "cpu")
    prefetched = max(unacked_count - running_units, 0)
    waiting = ready + unacked.scaled(prefetched / unacked_count if unacked_count else 0.0)
    return PoolLoad(
        pool=CPU_POOL, resource="cpu", member_units=member_units, size=size,
        ready=sum(q.ready for q in inventory.queues if q.pool == "cpu"),
        prefetched=prefetched, running=min(running_units, unacked_count),
        running_units=running_units, predicted_work_s=waiting.seconds,
        unknown=waiting.unknown, recent_queue_s=recent.queue_s, recent_exec_s=recent.exec_s,
        since_scale_s=since_scale_s,
        memory_mb=sum(n.reserved_mb for n in live) + inventory.memory_line.memory_mb,
        memory_waiting=inventory.memory_line.waiting, member_memory_mb=member_memory_mb,
    )


class Controller:
    """Gathers a tick's inputs, decides, actuates, logs and publishes."""

    def __init__(
        self, client: redis.Redis, settings: Settings, actuator: Actuator,
        options: AutoscalerOptions, clock: Callable[[], float] = time.time,
    ) -> None:
        self._redis = client
        self._settings = settings
        self.actuator = actuator
        self.options = options
        self._clock = clock
        self._last_scale: dict[str, float] = {}
        self.decisions: list[tuple[float, Decision]] = []

    def tick(self) -> Decision:
        """One gather -> decide -> actuate round."""
        now = self._clock()
        self.actuator.step()
        loads = [self._cpu_load(now)]
        decision = decide(loads, self.options.budget(), self.options.scaling)
        for target in decision.targets:
            if target.target != target.current:
                log.info("autoscale %s", target.describe())
                self.actuator.scale(target.pool, target.target)
                self._last_scale[target.pool] = now
            else:
                log.debug("autoscale %s", target.describe())
        self._publish(decision, now)
        self.decisions.append((now, decision))
        return decision

    def run(self, stop: threading.Event) -> None:
        """Tick every ``interval_s`` until ``stop`` is set; a failed tick is logged and retried."""
        while not stop.is_set():
            try:
                self.tick()
            except redis.RedisError:
                log.warning("autoscaler tick failed (Redis); retrying", exc_info=True)
            except ServiceError as exc:
                log.warning("autoscaler tick failed: %s; retrying", exc)
            stop.wait(self.options.interval_s)

    def _cpu_load(self, now: float) -> PoolLoad:
        inventory = read_inventory(self._redis, self._settings, now)
        queues = [q.queue for q in inventory.queues if q.pool == "cpu"]
        ready = messages_work(self._peek(queues))
        unacked = unacked_work(self._redis.hvals("unacked"), set(queues))
        recent = recent_act(self._recent_records(), "cpu", now - ACT_WINDOW_S)
        since = now - self._last_scale.get(CPU_POOL, float("-inf"))
        size = self.actuator.sizes().get(CPU_POOL, 0)
        return cpu_load(inventory, ready, unacked, recent, size, self.options.node_cores, since,
                        self.options.node_memory_mb)

    def _peek(self, queues: Sequence[str]) -> list[bytes]:
        options = celery_config(self._settings)["broker_transport_options"]
        pipe = self._redis.pipeline()
        for queue in queues:
            for _, key in priority_lists(queue, str(options["sep"]),
                                         list(options["priority_steps"])):
                pipe.lrange(key, 0, PEEK_LIMIT - 1)
        return [raw for chunk in pipe.execute() for raw in chunk]

    def _recent_records(self) -> list[ActRecord]:
        entries: Any = self._redis.xrevrange(keys.METRICS_ACTS, count=ACT_SCAN)
        return [r for _, raw in entries or () if raw and (r := ActRecord.decode(raw)) is not None]

    def _publish(self, decision: Decision, now: float) -> None:
        pipe = self._redis.pipeline()
        for target in decision.targets:
            pipe.sadd(keys.AUTOSCALE_POOLS, target.pool)
            pipe.hset(keys.autoscale_pool(target.pool), mapping={
                "target": target.target, "actual": target.current,
                "units": self.options.node_cores, "action": target.action,
                "reason": target.reason[:500], "at": now,
            })
        pipe.execute()


def worker_env(settings: Settings) -> dict[str, str]:
    """The ``TANGRAM_`` environment handed to the workers the controller starts."""
    return {
        "TANGRAM_REDIS_URL": settings.broker.redis_url,
        "TANGRAM_SANDBOX_ROOT": str(settings.sandbox.root),
        "TANGRAM_NODE_HEARTBEAT_S": str(settings.node.heartbeat_s),
        "TANGRAM_NODE_TTL_S": str(settings.node.ttl_s),
        "TANGRAM_SANDBOX_BACKEND": settings.sandbox.backend,
        "TANGRAM_SCHEDULER": settings.node.scheduler,
    }


def local_controller(
    settings: Settings, options: AutoscalerOptions, log_dir: Path, prefix: str = "auto",
    env: Mapping[str, str] | None = None,
) -> Controller:
    """A controller over local node-worker processes (the embedded default)."""
    client = connect(settings.broker)
    actuator = LocalProcessActuator(
        client, env if env is not None else worker_env(settings), options.node_cores,
        options.node_memory_mb, log_dir, prefix, options.drain_timeout_s,
        registry=Registry(client, settings.node.ttl_s, settings.actions.trajectory_ttl_s),
    )
    return Controller(client, settings, actuator, options)


def kubernetes_controller(settings: Settings, options: AutoscalerOptions,
                          apps_api: Any | None = None) -> Controller:
    """A controller scaling the CPU node workload of ``TANGRAM_KUBERNETES_CPU_WORKLOAD`` (the
    ``tangram-cpu-node`` StatefulSet of deploy/k8s) through its ``scale`` subresource."""
    client = connect(settings.broker)
    actuator = KubernetesActuator(
        apps_api if apps_api is not None else cluster_apps_api(),
        {CPU_POOL: Workload.from_settings(settings.autoscale)}, drain=NodeDrain(client),
        node_memory_mb=options.node_memory_mb, drain_timeout_s=options.drain_timeout_s,
    )
    return Controller(client, settings, actuator, options)


FLAGS: tuple[tuple[str, type, str], ...] = (
    ("interval", float, "autoscale_interval_s"),
    ("node-cores", int, "autoscale_node_cores"),
    ("node-memory-mb", float, "autoscale_node_memory_mb"),
    ("min-nodes", int, "autoscale_min_nodes"),
    ("max-nodes", int, "autoscale_max_nodes"),
    ("budget-cores", int, "autoscale_budget_cores"),
    ("target-wait", float, "autoscale_target_wait_s"),
    ("down-hold", float, "autoscale_down_hold_s"),
    ("drain-timeout", float, "autoscale_drain_timeout_s"),
)
"""``tangram autoscaler`` flags and the setting each one overrides for that run."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``tangram autoscaler``; each defaults to its ``TANGRAM_AUTOSCALE_*``
    setting."""
    for flag, kind, setting in FLAGS:
        parser.add_argument(f"--{flag}", type=kind, default=None,
                            help=f"overrides TANGRAM_{setting.upper()} for this run")
    scaling = ScalingConfig()
    parser.add_argument("--low-water", type=float, default=scaling.low_water)
    parser.add_argument("--queue-slo", type=float, default=scaling.queue_slo_s)
    parser.add_argument("--log-dir", type=Path, default=Path("/var/tmp/tangram-autoscaler"))  # nosec B108 # a log dir default, overridable with --log-dir; no temp file


def options_from_settings(autoscale: AutoscaleSettings, low_water: float | None = None,
                          queue_slo_s: float | None = None) -> AutoscalerOptions:
    """:class:`AutoscalerOptions` from the ``TANGRAM_AUTOSCALE_*`` settings."""
    base = ScalingConfig()
    return AutoscalerOptions(
        interval_s=autoscale.interval_s, node_cores=autoscale.node_cores,
        node_memory_mb=autoscale.node_memory_mb,
        min_nodes=autoscale.min_nodes, max_nodes=autoscale.max_nodes,
        budget_cores=autoscale.budget_cores,
        drain_timeout_s=autoscale.drain_timeout_s,
        scaling=ScalingConfig(
            target_wait_s=autoscale.target_wait_s,
            down_hold_s=autoscale.down_hold_s,
            low_water=base.low_water if low_water is None else low_water,
            queue_slo_s=base.queue_slo_s if queue_slo_s is None else queue_slo_s,
        ),
    )


def options_from_args(args: argparse.Namespace, settings: Settings) -> AutoscalerOptions:
    """:class:`AutoscalerOptions` from the settings, with the flags given on the command line
    applied over them (checked like the settings themselves)."""
    given = {setting: getattr(args, flag.replace("-", "_")) for flag, _, setting in FLAGS}
    merged = settings.with_(**{k: v for k, v in given.items() if v is not None})
    return options_from_settings(merged.autoscale, args.low_water, args.queue_slo)


def run_from_args(settings: Settings, args: argparse.Namespace) -> int:
    """Run ``tangram autoscaler`` until SIGINT or SIGTERM, then stop the workers it started."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    options = options_from_args(args, settings)
    if settings.autoscale.actuator == "kubernetes":
        controller = kubernetes_controller(settings, options)
    else:
        args.log_dir.mkdir(parents=True, exist_ok=True)
        controller = local_controller(settings, options, args.log_dir)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        controller.run(stop)
    finally:
        controller.actuator.close()
    return 0
