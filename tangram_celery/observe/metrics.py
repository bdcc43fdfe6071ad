"""``tangram exporter``: Prometheus metrics of ACT per action kind and pool, queue depths, pools.

Two sources, both in Redis:

* the ACT log (``keys.METRICS_ACTS``, appended by every worker; :mod:`tangram_celery.tasks.actlog`),
  read continuously by a background thread into histograms, so nothing is lost between scrapes
  and several exporters can read the same stream;
* the inventory (:mod:`tangram_celery.pools.inventory`), read at each scrape: queue depths per
  priority sub-list, unacked (prefetched or running) messages, CPU nodes, GPU pools and API slots.

Histograms count from the exporter's start (records already in the stream are skipped), as
Prometheus expects of counters. Metric families (all prefixed ``tangram_``):

==================================  =====================  ===================================
name                                labels                 meaning
==================================  =====================  ===================================
action_act_seconds (histogram)      kind, pool             ACT = queue + exec + overhead
action_queue_seconds (histogram)    kind, pool             submit to admission with units
action_exec_seconds (histogram)     kind, pool             the action's own execution
action_overhead_seconds (histogram) kind, pool             everything else, to the result store
actions_total (counter)             kind, pool, status     finished actions
queue_depth                         queue, pool            ready messages, all priorities
queue_messages                      queue, pool, priority  ready messages of one priority list
queue_unacked                       queue, pool            delivered to a worker, not acked
pool_units                          pool, resource         units of the pool's live members
pool_units_allocated                pool, resource         units held by running actions
pool_members_alive                  pool                   live CPU nodes / GPU pool workers
node_cores, node_cores_free         node                   one CPU node
node_alive                          node                   1 while its heartbeat is fresh
gpu_resident_gpus                   pool, model            GPUs holding a resident model
autoscale_target_members            pool                   the autoscaler's target size
autoscale_actual_members            pool                   the size it saw at that tick
exporter_redis_up                   -                      1 when the last scrape read Redis
exporter_act_records_total          -                      ACT records read from the stream
==================================  =====================  ===================================

``pool`` is ``cpu``, ``gpu/<pool>`` or ``api/<api>`` (see :func:`actlog.pool_of_queue`).

Access: with ``TANGRAM_EXPORTER_PASSWORD`` set, every request needs basic auth
(``TANGRAM_EXPORTER_USER``, default ``tangram``; a Prometheus scrape job's ``basic_auth``);
without one the exporter serves only on a loopback address and refuses any other.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tangram_celery import keys
from tangram_celery.command_line import run_with_settings
from tangram_celery.connection import connect
from tangram_celery.credentials import basic_authorization, require_credential
from tangram_celery.errors import BrokerUnreachable
from tangram_celery.observe.metrics_server import serve_metrics
from tangram_celery.pools.inventory import Inventory, read_inventory
from tangram_celery.settings import Settings
from tangram_celery.tasks.actlog import ActRecord

log = logging.getLogger(__name__)

DEFAULT_EXPORTER_PORT = 9808
ACT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
               30.0, 60.0, 120.0, 300.0, 900.0, float("inf"))
PARTS = (("act", "total_s", "ACT: queue + exec + overhead"),
         ("queue", "queue_s", "submit to admission with units (broker wait included)"),
         ("exec", "exec_s", "the action's own execution"),
         ("overhead", "overhead_s", "everything else up to the stored result"))
READ_COUNT = 1000
RETRY_S = 1.0


class ActMetrics:
    """Histograms of each ACT part and a status counter, per action kind and pool."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._histograms = {
            attr: Histogram(f"tangram_action_{part}_seconds", f"Action {doc}, in seconds.",
                            ("kind", "pool"), registry=registry, buckets=ACT_BUCKETS)
            for part, attr, doc in PARTS
        }
        self._actions = Counter("tangram_actions", "Finished actions by status.",
                                ("kind", "pool", "status"), registry=registry)
        self._records = Counter("tangram_exporter_act_records",
                                "ACT records read from the stream.", registry=registry)

    def observe(self, record: ActRecord) -> None:
        """Count one finished action."""
        for attr, histogram in self._histograms.items():
            histogram.labels(record.kind, record.pool).observe(max(getattr(record, attr), 0.0))
        self._actions.labels(record.kind, record.pool, record.status).inc()
        self._records.inc()


def inventory_families(inventory: Inventory) -> list[Metric]:
    """The gauges of one inventory snapshot."""
    depth = GaugeMetricFamily("tangram_queue_depth",
                              "Ready messages in a queue, over every priority sub-list.",
                              labels=("queue", "pool"))
    by_priority = GaugeMetricFamily("tangram_queue_messages",
                                    "Ready messages in one priority sub-list of a queue.",
                                    labels=("queue", "pool", "priority"))
    unacked = GaugeMetricFamily("tangram_queue_unacked",
                                "Messages delivered to a worker and not acked (held or running).",
                                labels=("queue", "pool"))
    for queue in inventory.queues:
        depth.add_metric((queue.queue, queue.pool), queue.ready)
        unacked.add_metric((queue.queue, queue.pool), queue.unacked)
        for step, count in queue.by_priority:
            by_priority.add_metric((queue.queue, queue.pool, str(step)), count)
    return [depth, by_priority, unacked, *_pool_families(inventory),
            *_node_families(inventory), _resident_family(inventory),
            *_autoscale_families(inventory)]


def _autoscale_families(inventory: Inventory) -> list[Metric]:
    target = GaugeMetricFamily("tangram_autoscale_target_members",
                               "Members the autoscaler wants in a pool (its last decision).",
                               labels=("pool",))
    actual = GaugeMetricFamily("tangram_autoscale_actual_members",
                               "Members a pool had when the autoscaler last decided.",
                               labels=("pool",))
    for view in inventory.autoscale:
        target.add_metric((view.pool,), view.target)
        actual.add_metric((view.pool,), view.actual)
    return [target, actual]


def _pool_families(inventory: Inventory) -> list[Metric]:
    units = GaugeMetricFamily("tangram_pool_units", "Units of a pool's live members.",
                              labels=("pool", "resource"))
    allocated = GaugeMetricFamily("tangram_pool_units_allocated",
                                  "Units held by running actions.", labels=("pool", "resource"))
    alive = GaugeMetricFamily("tangram_pool_members_alive",
                              "Live members of a pool (CPU nodes, GPU pool workers).",
                              labels=("pool",))
    for pool in inventory.pools():
        if pool.units is not None:
            units.add_metric((pool.pool, pool.resource), pool.units)
        allocated.add_metric((pool.pool, pool.resource), pool.allocated)
        if pool.resource != "slots":
            alive.add_metric((pool.pool,), pool.members_alive)
    return [units, allocated, alive]


def _node_families(inventory: Inventory) -> list[Metric]:
    cores = GaugeMetricFamily("tangram_node_cores", "Cores a CPU node schedules.",
                              labels=("node",))
    free = GaugeMetricFamily("tangram_node_cores_free", "Cores of a CPU node not allocated.",
                             labels=("node",))
    alive = GaugeMetricFamily("tangram_node_alive", "1 while a CPU node's heartbeat is fresh.",
                              labels=("node",))
    for node in inventory.nodes:
        cores.add_metric((node.name,), node.cores)
        free.add_metric((node.name,), node.free_cores)
        alive.add_metric((node.name,), int(node.alive))
    return [cores, free, alive]


def _resident_family(inventory: Inventory) -> Metric:
    resident = GaugeMetricFamily("tangram_gpu_resident_gpus",
                                 "GPUs of a GPU pool holding a resident reward model.",
                                 labels=("pool", "model"))
    for pool in inventory.gpu_pools:
        totals: dict[str, int] = {}
        for item in pool.residents:
            totals[item.model] = totals.get(item.model, 0) + len(item.gpus)
        for model, gpus in sorted(totals.items()):
            resident.add_metric((f"gpu/{pool.name}", model), gpus)
    return resident


class InventoryCollector(Collector):
    """Reads the inventory at each scrape; a Redis failure only sets ``exporter_redis_up`` 0."""

    def __init__(self, read: Callable[[], Inventory]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        """Yield the inventory gauges and ``tangram_exporter_redis_up``."""
        up = GaugeMetricFamily("tangram_exporter_redis_up",
                               "1 when the last scrape could read Redis.")
        try:
            families = inventory_families(self._read())
        except (redis.RedisError, OSError) as exc:
            log.warning("scrape could not read Redis: %s", exc)
            up.add_metric((), 0)
            yield up
            return
        up.add_metric((), 1)
        yield up
        yield from families


@dataclass
class ActConsumer:
    """Reads the ACT stream from where it stood at start into :class:`ActMetrics`."""

    client: redis.Redis
    metrics: ActMetrics
    block_ms: int = 1000
    last_id: str | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    def poll(self) -> int:
        """Read and observe the next records (blocking up to ``block_ms``); returns how many."""
        if self.last_id is None:
            newest: Any = self.client.xrevrange(keys.METRICS_ACTS, count=1)
            self.last_id = _text(newest[0][0]) if newest else "0-0"
        reply: Any = self.client.xread({keys.METRICS_ACTS: self.last_id}, count=READ_COUNT,
                                       block=self.block_ms)
        return sum(self._observe(entries) for _, entries in reply or ())

    def run(self) -> None:
        """Poll until :attr:`stop` is set; Redis errors are logged and retried."""
        while not self.stop.is_set():
            try:
                self.poll()
            except (redis.RedisError, OSError) as exc:
                log.warning("ACT stream read failed (%s); retrying", exc)
                self.stop.wait(RETRY_S)

    def _observe(self, entries: Sequence[tuple[Any, Any]]) -> int:
        for entry_id, fields in entries:
            self.last_id = _text(entry_id)
            record = ActRecord.decode(fields)
            if record is not None:
                self.metrics.observe(record)
        return len(entries)


@dataclass
class Exporter:
    """A running exporter: its HTTP server and stream reader (see :func:`exporter`)."""

    address: str
    port: int
    registry: CollectorRegistry
    consumer: ActConsumer
    _stop: Callable[[], None]

    @property
    def url(self) -> str:
        """The scrape URL."""
        return f"http://{self.address}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and reading."""
        self._stop()


@contextlib.contextmanager
def exporter(
    settings: Settings, address: str = "127.0.0.1", port: int = DEFAULT_EXPORTER_PORT,
    extra_queues: Iterable[str] = (),
) -> Iterator[Exporter]:
    """Serve ``/metrics`` on ``address:port`` (port 0: a free one) from this process's threads.

    Opens no connection until it runs; a Redis that is down makes scrapes report
    ``tangram_exporter_redis_up 0`` and the stream reader retry. Scrapers authenticate with
    ``settings.observe``'s exporter user and password; without a password, an address off
    loopback raises :class:`~tangram_celery.errors.ConfigError` before anything starts.
    """
    observe = settings.observe
    require_credential(address, observe.exporter_password, "tangram exporter",
                       "set TANGRAM_EXPORTER_PASSWORD (scrapers then send basic auth)")
    authorization = (basic_authorization(observe.exporter_user, observe.exporter_password)
                     if observe.exporter_password else None)
    client = connect(settings.broker, retry_s=0)
    extra = tuple(extra_queues)
    registry = CollectorRegistry()
    consumer = ActConsumer(client, ActMetrics(registry))
    registry.register(InventoryCollector(lambda: read_inventory(client, settings,
                                                                extra_queues=extra)))
    server, _ = serve_metrics(registry, address, port, authorization)
    reader = threading.Thread(target=consumer.run, name="tangram-exporter-acts", daemon=True)
    reader.start()

    def stop() -> None:
        consumer.stop.set()
        server.shutdown()
        server.server_close()
        reader.join(timeout=consumer.block_ms / 1000 + 5)
        client.close()

    running = Exporter(address, int(server.server_address[1]), registry, consumer, stop)
    try:
        yield running
    finally:
        running.close()


def run_exporter(
    settings: Settings, address: str = "127.0.0.1", port: int = DEFAULT_EXPORTER_PORT,
    extra_queues: Iterable[str] = (),
) -> None:
    """``tangram exporter``: serve metrics until SIGINT or SIGTERM."""
    done = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: done.set())
    with exporter(settings, address, port, extra_queues) as running:
        where = BrokerUnreachable.where(settings.broker.redis_url)
        access = (f"basic auth, user {settings.observe.exporter_user!r}"
                  if settings.observe.exporter_password else "no authentication, loopback only")
        print(f"tangram exporter: {running.url} ({access}; Redis {where})", flush=True)
        done.wait()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``tangram exporter`` (also ``python -m tangram_celery.observe.metrics``)."""
    parser.add_argument("--address", default=None,
                        help="listen address (default TANGRAM_EXPORTER_ADDRESS, 127.0.0.1; "
                             "0.0.0.0 for a remote scraper, with TANGRAM_EXPORTER_PASSWORD)")
    parser.add_argument("--port", type=int, default=None,
                        help=f"port (default TANGRAM_EXPORTER_PORT, {DEFAULT_EXPORTER_PORT})")
    parser.add_argument("--queue", action="append", default=[],
                        help="also measure this queue (repeatable); pools' queues are found")


def run_from_args(settings: Settings, args: argparse.Namespace) -> int:
    """Run ``tangram exporter`` with parsed :func:`add_arguments`."""
    run_exporter(settings, args.address or settings.observe.exporter_address,
                 args.port or settings.observe.exporter_port, args.queue)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m tangram_celery.observe.metrics``."""
    parser = argparse.ArgumentParser(prog="tangram exporter", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run_with_settings(parser, run_from_args, argv)


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


if __name__ == "__main__":
    sys.exit(main())
