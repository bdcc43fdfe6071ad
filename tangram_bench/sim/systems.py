"""The systems compared, by name, and how each is assembled from backends.

* ``tangram``: pooled, every action shaped elastic, the default policy (``robust``: the
  paper's allocator steered by predicted demand, :mod:`tangram_celery.scheduling.robust`, on
  CPU nodes; the service-aware scheduler, :mod:`tangram_celery.scheduling.replicas`, on the
  GPU pool). ``tangram:<policy>`` runs any registered policy (see :mod:`.policy`) on CPU
  nodes and, unless it is ``ersa``, the service-aware scheduler on GPUs; ``tangram:ersa`` is
  the paper's algorithm everywhere, as :func:`tangram_celery.scheduling.decide` implements it;
  ``tangram:replicas-no-<idea>`` runs a GPU ablation (see :data:`.gpupool.GPU_ABLATIONS`).
  tangram's basic manager serves API calls oldest trajectory first (``TANGRAM_API_BYPASS_S``,
  :func:`tangram_celery.scheduling.ordering.trajectory_order_key`); ``tangram:ersa`` and the
  ablation ``tangram:api-fcfs`` serve them FCFS by arrival, the paper's order.
* ``tangram:malleable[:<weighting>]``: tangram with malleable test runs on CPU nodes
  (:mod:`.malleable`): cores join and leave a running test run at every event, as the pure
  :func:`tangram_celery.scheduling.malleable.decide_resize` decides with its weighting
  (default :data:`MALLEABLE_WEIGHTING`); GPU pool and API calls as ``tangram``.
* ``fixed-dop-<k>``: pooled, every elastic action at a fixed DoP k (the paper's ablation), API
  calls FCFS as in the paper.
* ``celery``: plain Celery: FIFO, one queue per node with concurrency = cores, every action at
  one unit, no elasticity (the same routing and FCFS admission, ``TANGRAM_SCHEDULER=fcfs-min``);
  no cross-worker API quota, so API calls retry on rejection with backoff. ``fcfs-min`` is
  the same in the simulator (on the real stack it is tangram's node in that mode, and
  ``celery`` a stock Celery worker).
* ``static``: per-trajectory pods on CPU (:mod:`.pods`), static GPU services (:mod:`.services`),
  direct API calls with retries (:mod:`.quota`). ``static-n4``: the same with the test run
  using ``pytest -n 4`` inside its 4-core limit. ``static-tp<k>``: the same with the paper's GPU
  layout, one TP k replica per teacher, instead of the oracle-sized one.
* ``fixed-dop-<k>:cache``, ``celery:cache``: the pooled baselines made cache-aware on GPUs, by
  the classic means and none of tangram's: resident-first FCFS with a delay bounded by the
  restore time (:mod:`tangram_celery.scheduling.affinity`), and placement on a free chunk
  where the service is resident (:func:`tangram_celery.scheduling.affinity.cache_aware_chunks`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from tangram_bench.sim.cluster import Cluster
from tangram_bench.sim.costs import Costs
from tangram_bench.sim.durations import DurationMode, Durations
from tangram_bench.sim.engine import Backend, Engine, Progress
from tangram_bench.sim.gpupool import (
    CACHE_AWARE_POLICY,
    GPU_POLICIES,
    GpuPooled,
    gpu_policy_factory,
)
from tangram_bench.sim.malleable import MalleableKnobs, MalleableNodes
from tangram_bench.sim.nodes import CpuNodes
from tangram_bench.sim.pods import Pods, PodSpec
from tangram_bench.sim.policy import (
    DEFAULT_POLICY,
    Elastic,
    FixedDop,
    Minimum,
    Shape,
    policy_factory,
)
from tangram_bench.sim.quota import ApiDirect, ApiQuota
from tangram_bench.sim.record import RunResult
from tangram_bench.sim.services import StaticServices
from tangram_bench.workloads.model import Workload
from tangram_celery.scheduling.malleable import WEIGHTINGS, Weighting
from tangram_celery.scheduling.ordering import DEFAULT_BYPASS_S

DEFAULT_SYSTEMS = ("tangram", "static", "fixed-dop-4", "fixed-dop-16", "celery")
GPU_POLICY = "replicas"
"""tangram's policy on GPU pools (any tangram policy but the paper's own ``ersa``)."""
BASELINE_POLICY = "ersa"
"""The policy of the pooled baselines (fixed DoP, plain Celery): strict FCFS through the
paper's allocator, as those systems run, whatever tangram's default policy is."""
MALLEABLE = "malleable"
MALLEABLE_WEIGHTING: Weighting = "equi"
"""The weighting of ``tangram:malleable`` (chosen by ``tangram bench robustness
--weightings``)."""
API_FCFS = "api-fcfs"
"""The ablation ``tangram:api-fcfs``: tangram with API calls FCFS by arrival."""


@dataclass(frozen=True)
class System:
    """A named system: pooled (a shape and a policy) or static (a pod shape)."""

    name: str
    pooled: bool
    shape: Shape = field(default_factory=Elastic)
    policy: str = DEFAULT_POLICY
    gpu_policy: str = GPU_POLICY
    pod: PodSpec = field(default_factory=PodSpec)
    quota: bool = True
    api_bypass_s: float = 0.0
    tp: int | None = None
    cache_aware: bool = False
    malleable: Weighting | None = None


def system(name: str, default_policy: str = DEFAULT_POLICY) -> System:
    """The system called ``name`` (see the module docstring for the names)."""
    if name == "tangram" or name.startswith("tangram:"):
        policy = name.partition(":")[2] or default_policy
        kind, _, weighting = policy.partition(":")
        if kind == MALLEABLE:
            chosen = weighting or MALLEABLE_WEIGHTING
            if chosen not in WEIGHTINGS:
                raise ValueError(f"unknown weighting {chosen!r}; one of {list(WEIGHTINGS)}")
            return System(name, True, Elastic(), DEFAULT_POLICY, GPU_POLICY,
                          api_bypass_s=DEFAULT_BYPASS_S, malleable=_weighting(chosen))
        if policy == API_FCFS:
            return System(name, True, Elastic(), default_policy)
        if policy in GPU_POLICIES:
            return System(name, True, Elastic(), default_policy, policy,
                          api_bypass_s=DEFAULT_BYPASS_S)
        policy_factory(policy)
        paper = policy == BASELINE_POLICY
        return System(name, True, Elastic(), policy, BASELINE_POLICY if paper else GPU_POLICY,
                      api_bypass_s=0.0 if paper else DEFAULT_BYPASS_S)
    cache = name.endswith(":cache")
    gpu_baseline = CACHE_AWARE_POLICY if cache else BASELINE_POLICY
    fixed = re.fullmatch(r"fixed-dop-(\d+)(:cache)?", name)
    if fixed:
        return System(name, True, FixedDop(int(fixed.group(1))), BASELINE_POLICY,
                      gpu_baseline, cache_aware=cache)
    if name in ("celery", "celery:cache", "fcfs-min"):
        return System(name, True, Minimum(), BASELINE_POLICY, gpu_baseline, quota=False,
                      cache_aware=cache)
    if name == "static":
        return System(name, False)
    if name == "static-n4":
        return System(name, False, pod=PodSpec(test_threads=4))
    layout = re.fullmatch(r"static-tp(\d+)", name)
    if layout and int(layout.group(1)) > 0:
        return System(name, False, tp=int(layout.group(1)))
    raise ValueError(f"unknown system {name!r}; use tangram[:policy], fixed-dop-<k>[:cache], "
                     "celery[:cache], fcfs-min, static, static-n4 or static-tp<k>")


def _weighting(name: str) -> Weighting:
    return next(w for w in WEIGHTINGS if w == name)


def backends(workload: Workload, chosen: System, cluster: Cluster, costs: Costs,
             seed: int, durations: DurationMode | None = None,
             knobs: MalleableKnobs | None = None) -> dict[str, Backend]:
    """One backend per pool type the workload uses; the policies of CPU nodes and of the GPU
    pool see ``durations`` (default: learned online, see :mod:`.durations`); malleable test
    runs resize at the costs of ``knobs`` (default: the measured ones)."""
    seen = Durations(durations or DurationMode(), seed)
    pools = {a.pool for t in workload.trajectories for a in t.actions}
    built: dict[str, Backend] = {}
    if chosen.pooled:
        factory = policy_factory(chosen.policy)
        gpu = gpu_policy_factory(chosen.gpu_policy)
        weighting = chosen.malleable
        resize = replace(knobs or MalleableKnobs(), weighting=weighting or MALLEABLE_WEIGHTING)
        makers: dict[str, Callable[[], Backend]] = {
            "cpu": lambda: (MalleableNodes(workload, cluster, costs, resize, seen)
                            if weighting is not None else
                            CpuNodes(workload, cluster, chosen.shape, factory, costs, seen)),
            "gpu": lambda: GpuPooled(workload, cluster, chosen.shape, gpu, costs,
                                     chosen.cache_aware, seen),
            "api": lambda: (ApiQuota(workload, cluster, costs, chosen.api_bypass_s)
                            if chosen.quota else
                            ApiDirect(workload, cluster, costs, seed, costs.dispatch_s)),
        }
    else:
        makers = {
            "cpu": lambda: Pods(workload, cluster, costs, chosen.pod),
            "gpu": lambda: StaticServices(workload, cluster, costs, chosen.tp),
            "api": lambda: ApiDirect(workload, cluster, costs, seed),
        }
    for pool in ("cpu", "gpu", "api"):
        if pool in pools:
            built[pool] = makers[pool]()
    return built


def simulate(workload: Workload, name: str, cluster: Cluster, costs: Costs, *, seed: int = 0,
             point: dict[str, object] | None = None, progress: Progress | None = None,
             default_policy: str = DEFAULT_POLICY, durations: DurationMode | None = None,
             knobs: MalleableKnobs | None = None) -> RunResult:
    """Run system ``name`` on ``workload``; the result holds every action's record. The
    policies of CPU nodes and of the GPU pool see ``durations`` (default: learned online,
    :mod:`.durations`); ``knobs``: the resize costs of ``tangram:malleable``."""
    chosen = system(name, default_policy)
    result = RunResult(name, workload.name, dict(point or {}))
    began = time.perf_counter()
    built = backends(workload, chosen, cluster, costs, seed, durations, knobs)
    Engine(workload, built, progress).run(result)
    result.wall_s = time.perf_counter() - began
    return result
