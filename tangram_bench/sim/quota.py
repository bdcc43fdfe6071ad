"""Quota-limited APIs: the provider, tangram's basic manager, and clients calling on their own.

The provider accepts a call when fewer than ``concurrency`` are in flight and its token bucket
(refilled at ``qps`` a second, holding at most ``max(1, qps)`` tokens, full at the start) has a
token; otherwise it rejects the call after ``Cluster.reject_s``.

* :class:`ApiQuota` (pooled systems): the basic manager admits calls only when the provider
  would accept them, across all workers, so nothing is ever rejected; in its order, oldest
  trajectory first with a bypass bound (``bypass_s``, ``TANGRAM_API_BYPASS_S``; 0 is plain FCFS,
  the paper's order), through the same key function
  (:func:`tangram_celery.scheduling.ordering.trajectory_order_key`).
* :class:`ApiDirect` (static per-trajectory, and plain Celery, which has no cross-worker
  quota): every call goes to the provider itself (through the broker first for plain Celery:
  ``dispatch_s``) and, when rejected, retries after an exponential backoff with full jitter
  (uniform in ``[0, min(cap, base * 2**attempt)]``, as Celery's ``retry_backoff`` with
  ``retry_jitter``), seeded per action.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from tangram_bench.sim.cluster import Cluster
from tangram_bench.sim.costs import Costs
from tangram_bench.sim.record import ActionRecord, Allocation, Live, RunResult
from tangram_bench.sim.timeline import Timeline
from tangram_bench.workloads.model import ApiLimit, Workload
from tangram_celery.scheduling.ordering import DEFAULT_BYPASS_S, trajectory_order_key

EPSILON = 1e-9


class Provider:
    """An API's server-side quota: concurrency cap plus a token bucket."""

    def __init__(self, limit: ApiLimit) -> None:
        self.limit = limit
        self.capacity = max(1.0, limit.qps)
        self.tokens = self.capacity
        self.last = 0.0
        self.inflight = 0
        self.peak = 0

    def _refill(self, now: float) -> None:
        self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.limit.qps)
        self.last = now

    def accepts(self, now: float) -> bool:
        """Whether a call starting now would be accepted."""
        self._refill(now)
        return self.inflight < self.limit.concurrency and self.tokens >= 1.0 - EPSILON

    def take(self, now: float) -> None:
        """Start a call (``accepts`` must be true)."""
        self._refill(now)
        self.tokens -= 1.0
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)

    def done(self) -> None:
        """A call finished."""
        self.inflight -= 1

    def token_at(self, now: float) -> float:
        """When the next token is there (``now`` if one is)."""
        self._refill(now)
        return now + max(0.0, 1.0 - self.tokens) / self.limit.qps


@dataclass(frozen=True)
class Call:
    """An API call in flight or waiting: its action, when it arrived, tries so far."""

    live: Live
    arrived: float
    attempts: int = 0
    started: float = 0.0


class _ApiBackend:
    """What both API backends share: providers, finishing calls, records."""

    def __init__(self, workload: Workload, cluster: Cluster, costs: Costs) -> None:
        self.workload = workload
        self.cluster = cluster
        self.providers = {api.name: Provider(api) for api in workload.apis}
        self.timeline: Timeline[tuple[str, Call]] = Timeline()
        self.allocations: list[Allocation] = []

    def spec_of(self, call: Call) -> tuple[str, float]:
        """The API name and the duration of ``call``."""
        spec = self.workload.trajectories[call.live.trajectory].actions[call.live.index]
        return spec.service, spec.t1

    def begin(self, trajectory: int, now: float) -> None:
        """Nothing per trajectory."""

    def end(self, trajectory: int, now: float) -> None:
        """Nothing per trajectory."""

    def next_time(self) -> float:
        """The next internal event."""
        return self.timeline.next_time()

    def start(self, call: Call, now: float) -> None:
        """Start ``call`` at the provider now."""
        api, duration = self.spec_of(call)
        self.providers[api].take(now)
        self.timeline.push(now + duration, ("finish", Call(call.live, call.arrived,
                                                         call.attempts, now)))

    def finish(self, call: Call, now: float) -> ActionRecord:
        """Record a finished call and free its provider slot."""
        api, _ = self.spec_of(call)
        self.providers[api].done()
        live = call.live
        spec = self.workload.trajectories[live.trajectory].actions[live.index]
        self.allocations.append(Allocation(f"api:{api}", (), call.started, now))
        return ActionRecord(
            trajectory=self.workload.trajectories[live.trajectory].id, index=live.index,
            kind=spec.kind, pool="api", node=api, units=1, submitted=live.submitted,
            started=call.started, finished=now, queue=call.started - call.arrived,
            exec=now - call.started, overhead=call.arrived - live.submitted,
            held=now - call.started, used=now - call.started)

    def close(self, result: RunResult) -> None:
        """Peak concurrency share per API."""
        for name, provider in self.providers.items():
            result.peak_share[f"api:{name}"] = provider.peak / provider.limit.concurrency
            result.capacity[f"api:{name}"] = float(provider.limit.concurrency)


class ApiQuota(_ApiBackend):
    """Pooled systems: tangram's basic manager, admission within the quota in its order."""

    def __init__(self, workload: Workload, cluster: Cluster, costs: Costs,
                 bypass_s: float = DEFAULT_BYPASS_S) -> None:
        super().__init__(workload, cluster, costs)
        self.dispatch_s = costs.dispatch_s
        self.bypass_s = bypass_s
        self.queues: dict[str, list[tuple[float, int, Call]]] = {n: [] for n in self.providers}
        self.first_seen: dict[int, float] = {}
        self.arrivals = 0
        self.wake: dict[str, float] = {}

    def enqueue(self, call: Call) -> None:
        """Queue ``call`` at its place: its key, then arrival."""
        first = self.first_seen.setdefault(call.live.trajectory, call.arrived)
        key = trajectory_order_key(first, call.arrived, self.bypass_s)
        self.arrivals += 1
        heapq.heappush(self.queues[self.spec_of(call)[0]], (key, self.arrivals, call))

    def submit(self, live: Live, now: float) -> None:
        """The call joins its API's queue after the dispatch cost."""
        self.timeline.push(now + self.dispatch_s, ("arrive", Call(live, now + self.dispatch_s)))

    def advance(self, now: float) -> list[ActionRecord]:
        """Queue arrivals, finish calls."""
        done = []
        for code, call in self.timeline.due(now):
            if code == "arrive":
                self.enqueue(call)
            elif code == "finish":
                done.append(self.finish(call, now))
        return done

    def dispatch(self, now: float) -> None:
        """Admit the first calls of the queues while the provider would accept them."""
        for name, queue in self.queues.items():
            provider = self.providers[name]
            while queue and provider.accepts(now):
                self.start(heapq.heappop(queue)[2], now)
            if queue and provider.inflight < provider.limit.concurrency:
                at = provider.token_at(now)
                if self.wake.get(name, -1.0) <= now < at:
                    self.wake[name] = at
                    self.timeline.push(at, ("wake", queue[0][2]))


class ApiDirect(_ApiBackend):
    """Calls that try the provider themselves, backing off when rejected."""

    def __init__(self, workload: Workload, cluster: Cluster, costs: Costs, seed: int,
                 dispatch_s: float = 0.0) -> None:
        super().__init__(workload, cluster, costs)
        self.seed = seed
        self.dispatch_s = dispatch_s
        self.tries: list[Call] = []
        self.rejections = 0

    def submit(self, live: Live, now: float) -> None:
        """The call reaches the provider after ``dispatch_s`` (0: the client calls it)."""
        if self.dispatch_s > 0:
            self.timeline.push(now + self.dispatch_s, ("retry", Call(live, now + self.dispatch_s)))
        else:
            self.tries.append(Call(live, now))

    def advance(self, now: float) -> list[ActionRecord]:
        """Finish calls; collect the retries due now."""
        done = []
        for code, call in self.timeline.due(now):
            if code == "finish":
                done.append(self.finish(call, now))
            else:
                self.tries.append(call)
        return done

    def dispatch(self, now: float) -> None:
        """Every try due now hits the provider: accepted, or rejected and rescheduled."""
        tries, self.tries = self.tries, []
        for call in tries:
            api, _ = self.spec_of(call)
            if self.providers[api].accepts(now):
                self.start(call, now)
                continue
            self.rejections += 1
            self.timeline.push(now + self.cluster.reject_s + self._backoff(call),
                               ("retry", Call(call.live, call.arrived, call.attempts + 1)))

    def _backoff(self, call: Call) -> float:
        rng = random.Random(f"{self.seed}:{call.live.trajectory}:{call.live.index}:"
                            f"{call.attempts}")
        ceiling = min(self.cluster.backoff_cap_s,
                      self.cluster.backoff_base_s * 2.0 ** call.attempts)
        return rng.uniform(0.0, ceiling)
