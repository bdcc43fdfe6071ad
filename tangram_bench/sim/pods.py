"""Static per-trajectory pods: what users run today, modelled as the strongest honest version.

Each trajectory gets its own pod when it starts and keeps it to its end, with a CPU request of
``request`` cores (0.5) and a limit of ``limit`` (4). Pods are placed on the node with the most
unrequested CPU (Kubernetes' least-allocated spreading), at most ``cores / request`` pods per
node and at most ``Costs.max_pods_per_node`` when that cap is on; a trajectory waits FCFS for a
slot when the cluster is full. A pod is usable ``Costs.pod_start_s`` after it is placed, and
every action pays ``Costs.exec_latency_s`` (the container exec path) before it runs. With
``Costs.api_qps`` set, each pod's creation waits for a token of the API client's bucket
(:class:`TokenBucket`); the wait counts as the trajectory's queue.

CPU sharing is the Linux CFS, idealised as a work-conserving fluid: an idle pod takes nothing;
each running action absorbs at most ``min(S(threads), limit)`` cores, where ``S`` is its
Amdahl speed-up (exec actions run one thread; the test run ``test_threads``: 1 for plain
``pytest``, 4 for ``pytest -n 4``); when a node's demand exceeds its cores they are shared by
equal weights (equal requests give equal ``cpu.shares``) with max-min fairness. An action with
one-core time T1 finishes when it has received T1 core-seconds. No context-switch or cache cost
is charged, so the baseline is, if anything, flattered.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tangram_bench.sim.cluster import Cluster
from tangram_bench.sim.costs import Costs
from tangram_bench.sim.record import ActionRecord, Live, RunResult
from tangram_bench.sim.timeline import Timeline
from tangram_bench.workloads.model import ActionSpec, Workload

DONE = 1e-9
"""Remaining core-seconds at or below which an action counts as finished."""


@dataclass(frozen=True)
class PodSpec:
    """The pod shape of the static baseline."""

    request: float = 0.5
    limit: float = 4.0
    test_threads: int = 1


@dataclass(frozen=True)
class Running:
    """An action running in a pod: what it is and how its ACT splits before exec."""

    live: Live
    spec: ActionSpec
    threads: int
    began: float
    queue: float
    overhead: float


def water_fill(demand: npt.NDArray[np.float64], capacity: float) -> npt.NDArray[np.float64]:
    """Max-min fair shares of ``capacity`` with equal weights, each capped at its demand."""
    if demand.sum() <= capacity:
        return demand.copy()
    ordered = np.sort(demand)
    n = len(ordered)
    before = np.concatenate(([0.0], np.cumsum(ordered)[:-1]))
    level_at = before + ordered * (n - np.arange(n))
    k = int(np.searchsorted(level_at, capacity))
    level = (capacity - before[k]) / (n - k)
    shares: npt.NDArray[np.float64] = np.minimum(demand, level)
    return shares


class TokenBucket:
    """A client-side rate limiter (client-go's token bucket, golang.org/x/time/rate): ``rate``
    tokens a second, at most ``burst`` held; a request takes one token, waiting for it when
    none is left, and requests are served in order."""

    def __init__(self, rate: float, burst: int) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"an API rate limit needs qps > 0 and burst >= 1, not {rate}, "
                             f"{burst}")
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self.last = 0.0

    def take(self, now: float) -> float:
        """The time at which a request made at ``now`` is sent."""
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        self.tokens -= 1.0
        return now if self.tokens >= 0 else now - self.tokens / self.rate


class PodNode:
    """One node: its pod count and the fluid CPU shares of the actions running in its pods."""

    def __init__(self, name: str, cores: int, slots: int) -> None:
        self.name = name
        self.cores = float(cores)
        self.slots = slots
        self.pods = 0
        self.running: list[Running] = []
        self.work = np.zeros(0)
        self.demand = np.zeros(0)
        self.rate = np.zeros(0)
        self.last = 0.0
        self.version = 0
        self.peak = 0.0

    def progress(self, now: float) -> None:
        """Advance every running action's work to ``now`` at the current rates."""
        if now > self.last and len(self.running):
            self.work -= self.rate * (now - self.last)
        self.last = now

    def add(self, running: Running, demand: float) -> None:
        """Start an action (call ``progress`` first)."""
        self.running.append(running)
        self.work = np.append(self.work, running.spec.t1)
        self.demand = np.append(self.demand, demand)
        self.rate = np.append(self.rate, 0.0)

    def finished(self) -> list[Running]:
        """Remove and return the actions whose work is done."""
        done = self.work <= DONE * np.maximum(1.0, self.demand)
        if not done.any():
            return []
        keep = ~done
        out = [r for r, d in zip(self.running, done.tolist(), strict=True) if d]
        self.running = [r for r, k in zip(self.running, keep.tolist(), strict=True) if k]
        self.work, self.demand, self.rate = self.work[keep], self.demand[keep], self.rate[keep]
        return out

    def reshare(self) -> float:
        """Recompute the shares; the time of the next finish (inf if idle)."""
        self.version += 1
        if not self.running:
            return math.inf
        self.rate = water_fill(self.demand, self.cores)
        self.peak = max(self.peak, float(self.rate.sum()) / self.cores)
        return self.last + float(np.min(self.work / self.rate))


class Pods:
    """The CPU backend of the static per-trajectory system."""

    def __init__(self, workload: Workload, cluster: Cluster, costs: Costs,
                 pod: PodSpec) -> None:
        self.workload = workload
        self.costs = costs
        self.pod = pod
        slots = int(cluster.cores_per_node / pod.request)
        if costs.max_pods_per_node is not None:
            slots = min(slots, costs.max_pods_per_node)
        self.nodes = [PodNode(f"pods-{n}", cluster.cores_per_node, slots)
                      for n in range(cluster.cpu_nodes)]
        self.api = (TokenBucket(costs.api_qps, costs.api_burst)
                    if costs.api_qps is not None else None)
        self.placed: dict[int, tuple[int, float]] = {}
        self.pending: deque[int] = deque()
        self.blocked: dict[int, Live] = {}
        self.timeline: Timeline[tuple[int, int, Running | None]] = Timeline()
        self.touched: set[int] = set()
        self.reserved = 0.0

    def begin(self, trajectory: int, now: float) -> None:
        """Create the trajectory's pod, or queue it for a slot."""
        self.pending.append(trajectory)
        self._place(now)

    def _place(self, now: float) -> None:
        while self.pending:
            open_nodes = [n for n, node in enumerate(self.nodes) if node.pods < node.slots]
            if not open_nodes:
                return
            node = min(open_nodes, key=lambda n: (self.nodes[n].pods, n))
            trajectory = self.pending.popleft()
            self.nodes[node].pods += 1
            self.placed[trajectory] = (node, now if self.api is None else self.api.take(now))
            live = self.blocked.pop(trajectory, None)
            if live is not None:
                self._schedule(live, now)

    def submit(self, live: Live, now: float) -> None:
        """Run in the trajectory's pod once it is ready, after the exec latency."""
        if live.trajectory in self.placed:
            self._schedule(live, now)
        else:
            self.blocked[live.trajectory] = live

    def _schedule(self, live: Live, now: float) -> None:
        node, placed_at = self.placed[live.trajectory]
        ready = placed_at + self.costs.pod_start_s
        began = max(now, ready) + self.costs.exec_latency_s
        queue = max(0.0, placed_at - live.submitted)
        spec = self.workload.trajectories[live.trajectory].actions[live.index]
        threads = min(self.pod.test_threads, spec.units[-1]) if spec.kind == "test_run" else 1
        running = Running(live, spec, threads, began, queue,
                          began - live.submitted - queue)
        self.timeline.push(began, (node, -1, running))

    def next_time(self) -> float:
        """The next action start or node finish."""
        return self.timeline.next_time()

    def advance(self, now: float) -> list[ActionRecord]:
        """Start actions, finish the ones whose work is done."""
        for node_index, version, running in self.timeline.due(now):
            node = self.nodes[node_index]
            if running is None and version != node.version:
                continue
            node.progress(now)
            if running is not None:
                demand = min(running.spec.speedup(running.threads), self.pod.limit)
                node.add(running, demand)
            self.touched.add(node_index)
        done = []
        for node_index in sorted(self.touched):
            for running in self.nodes[node_index].finished():
                done.append(self._record(running, self.nodes[node_index].name, now))
        return done

    def _record(self, running: Running, node: str, now: float) -> ActionRecord:
        live = running.live
        return ActionRecord(
            trajectory=self.workload.trajectories[live.trajectory].id, index=live.index,
            kind=running.spec.kind, pool="cpu", node=node, units=running.threads,
            submitted=live.submitted, started=running.began, finished=now,
            queue=running.queue, exec=now - running.began, overhead=running.overhead,
            held=0.0, used=running.spec.t1)

    def dispatch(self, now: float) -> None:
        """Re-share the nodes that changed and schedule their next finish."""
        for node_index in sorted(self.touched):
            node = self.nodes[node_index]
            at = node.reshare()
            if at < math.inf:
                self.timeline.push(at, (node_index, node.version, None))
        self.touched.clear()

    def end(self, trajectory: int, now: float) -> None:
        """Delete the trajectory's pod; place waiting ones."""
        node, placed_at = self.placed.pop(trajectory)
        self.nodes[node].pods -= 1
        self.reserved += self.pod.request * (now - placed_at)
        self._place(now)

    def close(self, result: RunResult) -> None:
        """Capacity, peak CPU share and reserved core-seconds (requests x pod lifetime)."""
        result.capacity["cpu"] = sum(node.cores for node in self.nodes)
        result.peak_share["cpu"] = max(node.peak for node in self.nodes)
        result.reserved += self.reserved
