"""Static GPU services: each reward model owns a fixed set of GPUs at a fixed parallelism.

Two layouts. The default (``static``) is the strongest honest one: every service runs
replicas at its smallest parallelism (the most throughput per GPU when E(m) < 1), and the GPUs
are split in proportion to each service's total demand over the whole workload (GPU-seconds at
that parallelism; an oracle that real operators only approximate), at least one replica each.
The paper's baseline (``static-tp<k>``, ``tp=k``): one replica per teacher at tensor
parallelism k (a teacher that cannot run at k runs at its smallest allowed parallelism above
k, else its largest), on as many GPUs as that takes, whatever the cluster holds beyond them.
Replicas are always resident (no restore); each serves one request at a time from its
service's FCFS queue.
"""

from __future__ import annotations

from collections import deque

from tangram_bench.sim.cluster import Cluster
from tangram_bench.sim.costs import Costs
from tangram_bench.sim.record import ActionRecord, Allocation, Live, RunResult
from tangram_bench.sim.timeline import Timeline
from tangram_bench.workloads.model import Workload
from tangram_celery.scheduling import GpuPool
from tangram_celery.scheduling.topology import GpuOperator

Chunk = tuple[int, ...]


def replica_counts(workload: Workload, gpus: int) -> dict[str, int]:
    """Replicas per service: proportional to demand, at least one, within ``gpus``."""
    demand = {s.name: 0.0 for s in workload.services}
    for trajectory in workload.trajectories:
        for action in trajectory.actions:
            if action.pool == "gpu":
                dop = workload.service(action.service).dops[0]
                demand[action.service] += dop * action.duration(dop)
    size = {s.name: s.dops[0] for s in workload.services}
    if sum(size.values()) > gpus:
        raise ValueError(f"{gpus} GPUs cannot host one replica of every service "
                         f"({sum(size.values())} needed)")
    counts = {name: 1 for name in demand}
    used = sum(size.values())
    while True:
        fits = [n for n in demand if used + size[n] <= gpus]
        if not fits:
            return counts
        name = max(fits, key=lambda n: (demand[n] / (counts[n] * size[n]), n))
        counts[name] += 1
        used += size[name]


def tp_size(dops: tuple[int, ...], tp: int) -> int:
    """The parallelism of a teacher's one replica in the paper's layout: ``tp`` if allowed,
    else the smallest allowed above it, else the largest allowed."""
    return min((d for d in dops if d >= tp), default=max(dops))


def tp_layout(workload: Workload, tp: int) -> tuple[dict[str, int], dict[str, int]]:
    """(replicas, parallelism) per service of the paper's layout: one replica each at TP."""
    return ({s.name: 1 for s in workload.services},
            {s.name: tp_size(s.dops, tp) for s in workload.services})


def replica_chunks(workload: Workload, cluster: Cluster,
                   tp: int | None = None) -> dict[str, list[Chunk]]:
    """Concrete aligned chunks of every replica (largest first, buddy best fit): the
    oracle-sized layout, or with ``tp`` the paper's one replica per teacher."""
    if tp is None:
        counts = replica_counts(workload, cluster.gpus)
        size = {s.name: s.dops[0] for s in workload.services}
    else:
        counts, size = tp_layout(workload, tp)
        if sum(size.values()) > cluster.gpus:
            raise ValueError(f"one TP{tp} replica per teacher needs {sum(size.values())} GPUs; "
                             f"the cluster has {cluster.gpus}: give it more GPUs")
    requests = [(f"{name}#{r}", size[name]) for name in sorted(counts, key=lambda n: -size[n])
                for r in range(counts[name])]
    pool = GpuPool("static", tuple(range(cluster.gpus)), cluster.gpus, cluster.gpus_per_node)
    assigned = GpuOperator(pool).assign(requests)
    chunks: dict[str, list[Chunk]] = {name: [] for name in counts}
    for request, _ in requests:
        chunks[request.split("#")[0]].append(assigned[request])
    return chunks


class StaticServices:
    """The GPU backend of the static system."""

    def __init__(self, workload: Workload, cluster: Cluster, costs: Costs,
                 tp: int | None = None) -> None:
        del costs
        self.workload = workload
        self.tp = tp
        self.chunks = replica_chunks(workload, cluster, tp)
        self.total = (cluster.gpus if tp is None
                      else sum(len(c) for chunks in self.chunks.values() for c in chunks))
        self.idle = {name: deque(chunks) for name, chunks in self.chunks.items()}
        self.queues: dict[str, deque[tuple[Live, float]]] = {n: deque() for n in self.chunks}
        self.timeline: Timeline[tuple[Live, Chunk, float, float]] = Timeline()
        self.allocations: list[Allocation] = []

    def begin(self, trajectory: int, now: float) -> None:
        """Nothing per trajectory."""

    def end(self, trajectory: int, now: float) -> None:
        """Nothing per trajectory."""

    def submit(self, live: Live, now: float) -> None:
        """The request joins its service's queue."""
        spec = self.workload.trajectories[live.trajectory].actions[live.index]
        self.queues[spec.service].append((live, now))

    def next_time(self) -> float:
        """The next finish."""
        return self.timeline.next_time()

    def advance(self, now: float) -> list[ActionRecord]:
        """Finish requests, free their replicas."""
        done = []
        for live, chunk, arrived, started in self.timeline.due(now):
            trajectory = self.workload.trajectories[live.trajectory]
            spec = trajectory.actions[live.index]
            self.idle[spec.service].append(chunk)
            self.allocations.append(Allocation("gpu", chunk, started, now))
            done.append(ActionRecord(
                trajectory=trajectory.id, index=live.index, kind=spec.kind, pool="gpu",
                node=spec.service, units=len(chunk), submitted=live.submitted,
                started=started, finished=now, queue=started - arrived, exec=now - started,
                overhead=arrived - live.submitted, held=len(chunk) * (now - started),
                used=len(chunk) * (now - started)))
        return done

    def dispatch(self, now: float) -> None:
        """Start queued requests on idle replicas of their service."""
        for name, queue in self.queues.items():
            idle = self.idle[name]
            while queue and idle:
                live, arrived = queue.popleft()
                chunk = idle.popleft()
                spec = self.workload.trajectories[live.trajectory].actions[live.index]
                self.timeline.push(now + spec.duration(len(chunk)), (live, chunk, arrived, now))

    def close(self, result: RunResult) -> None:
        """Allocations; every GPU of the layout is reserved for the whole run (the capacity
        is the cluster's, or with ``tp`` the layout's GPUs alone)."""
        result.allocations.extend(self.allocations)
        gpus = sum(len(c) for chunks in self.chunks.values() for c in chunks)
        result.capacity["gpu"] = float(self.total)
        result.reserved += gpus * max((r.finished for r in result.records), default=0.0)
