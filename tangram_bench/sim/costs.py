"""Control-plane costs the simulator can charge, each a flag with its documented source.

Two main presets: :data:`SCHEDULING_ONLY` (every cost off: only CPU/GPU scheduling effects
differ between systems) and :data:`CONTROL_PLANE` (the documented costs below, charged to
*every* system that pays them, tangram included). Headline ratios are reported under both. The
single-cost presets (:data:`SINGLE`) charge one cost alone, so each one's effect can be read on
its own.

The two measured costs (``dispatch_s``, ``exec_latency_s``) are read from
``measured_costs.json`` beside this module, which ``tangram bench costs`` writes: the median
over several runs on the real stack, with the range and the command in each flag's source.

Costs that are physics rather than control plane (a GPU model's restore time, an API's
rejection latency) live in :class:`~tangram_bench.sim.cluster.Cluster` and are always on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from importlib import resources
from typing import Any


@dataclass(frozen=True)
class Costs:
    """Per-action and per-trajectory control-plane costs (seconds; 0 or None: off).

    Pooled systems (tangram, fixed DoP, plain Celery) pay ``dispatch_s`` per action. The static
    per-trajectory baseline pays ``pod_start_s`` once per trajectory, ``exec_latency_s`` per
    action and is capped at ``max_pods_per_node`` pods per node; its pod creations pass a
    client-side token bucket of ``api_qps`` requests per second and ``api_burst`` tokens.
    """

    dispatch_s: float = 0.0
    pod_start_s: float = 0.0
    exec_latency_s: float = 0.0
    max_pods_per_node: int | None = None
    api_qps: float | None = None
    api_burst: int = 10


CHARGED = ("dispatch_s", "exec_latency_s")
"""The measured figures charged as control-plane costs (``tangram bench costs`` measures
more, as context)."""


def charged_costs(data: Mapping[str, Any]) -> dict[str, float]:
    """The cost charged for each of :data:`CHARGED` in a measurement ``tangram bench costs``
    wrote: its median over the runs, rounded to the millisecond."""
    return {name: round(float(data["figures"][name]["median"]), 3) for name in CHARGED}


def ms(value: float) -> str:
    """Seconds as milliseconds with one decimal."""
    return f"{value * 1000:.1f} ms"


def span(s: Mapping[str, float]) -> str:
    """A measured figure's spread as "median (min-max)" in milliseconds."""
    return f"{ms(s['median'])} ({s['min'] * 1000:.1f}-{s['max'] * 1000:.1f} ms)"


def source(data: Mapping[str, Any], name: str) -> str:
    """How a measured cost's source reads in a report's cost table."""
    return (f"median (min-max) over {data['runs']} runs of `{data['command']}` on "
            f"{data['machine']}, {data['date']}: {span(data['figures'][name])} "
            f"(tangram_bench/sim/measured_costs.json, {data['section']})")


MEASURED_FILE = "measured_costs.json"
MEASURED: dict[str, Any] = json.loads(
    resources.files("tangram_bench.sim").joinpath(MEASURED_FILE).read_text())
"""What ``tangram bench costs`` wrote: each figure's median and range over its runs."""
_MEASURED = charged_costs(MEASURED)

SCHEDULING_ONLY = Costs()
"""Every control-plane cost off."""

CONTROL_PLANE = Costs(
    dispatch_s=_MEASURED["dispatch_s"],
    pod_start_s=2.0,
    exec_latency_s=_MEASURED["exec_latency_s"],
    max_pods_per_node=110,
)
"""The documented costs (see :data:`SOURCES`)."""

SOURCES: dict[str, str] = {
    "dispatch_s": (
        "tangram's own per-action cost on our stack, a trivial sandboxed action's ACT less its "
        "exec (queue hand-off, broker, sandbox set-up, result path): "
        f"{source(MEASURED, 'dispatch_s')}; "
        "charged to tangram, fixed DoP and plain Celery alike"
    ),
    "pod_start_s": (
        "time from pod creation to a running container, once per trajectory. The Kubernetes "
        "pod-startup SLO (kubernetes/community sig-scalability/slos/pod_startup_latency.md) "
        "bounds it at p99 <= 5 s excluding image pulls; a bare `docker run --rm` of our "
        f"sandbox image took {span(MEASURED['figures']['docker_run_s'])} "
        f"(`{MEASURED['command']}`). "
        "2 s is an assumption between the two (scheduling, kubelet, CNI, container start)"
    ),
    "exec_latency_s": (
        "per-action container exec: `docker exec` through the Docker SDK (`exec_run(['true'])` "
        f"in a warm container): {source(MEASURED, 'exec_latency_s')}. "
        "A Kubernetes exec goes client -> kube-apiserver -> kubelet -> CRI streaming server, "
        "two more hops over the docker-exec path: this flag charges only the measured docker "
        "part. client-go's default client rate limit (QPS 5, burst 10: DefaultQPS and "
        "DefaultBurst in k8s.io/client-go/rest/config.go) throttles REST calls such as pod "
        "creation, not the SPDY/WebSocket exec stream; it is charged to pod creation apart, "
        "in its own preset (see api_qps)"
    ),
    "max_pods_per_node": (
        "kubelet's default maxPods is 110 pods per node (KubeletConfiguration maxPods; also the "
        "documented default of managed services, e.g. Huawei CCE), whatever the node's cores: "
        "a trajectory waits for a pod slot when every node holds 110 pods. 256 is the preset "
        "*pod cap 256 per node*: a node raised to one pod per core (the cap the audit of "
        "issue 20 also ran)"
    ),
    "api_qps": (
        "client-side rate limit of the Kubernetes API client that creates the pods (one create "
        "per trajectory): client-go's defaults are QPS 5 and burst 10 (DefaultQPS and "
        "DefaultBurst in k8s.io/client-go/rest/config.go), a token bucket in which a request "
        "waits for its token. Charged in its own preset only, not in *with control-plane "
        "costs*: frameworks raise it, and pod deletions and server-side API Priority and "
        "Fairness are not modelled"
    ),
    "api_burst": "the token bucket's size: client-go's DefaultBurst, 10 (see api_qps)",
}

OPERATOR: dict[str, str] = {
    "dispatch_s": "not a setting: tangram's measured cost, as above",
    "pod_start_s": "not a setting; pre-pulled images and warm pods lower it",
    "exec_latency_s": "not a setting: the measured cost of a container exec",
    "max_pods_per_node": (
        "256 on a 256-core node (kubelet --max-pods / KubeletConfiguration maxPods; preset "
        "*pod cap 256 per node*): the default 110 is what a cluster left untuned charges"
    ),
    "api_qps": (
        "raised in the client (client-go rest.Config QPS and Burst) by frameworks that create "
        "many pods; 5 is the untuned default"
    ),
    "api_burst": "raised with api_qps (rest.Config Burst); 10 is the untuned default",
}
"""Per flag, the value an operator running the static baseline would set, where it is a
setting (reports show it beside each flag's source)."""

SINGLE: dict[str, Costs] = {
    "pods110": Costs(max_pods_per_node=110),
    "pods256": Costs(max_pods_per_node=256),
    "podstart": Costs(pod_start_s=CONTROL_PLANE.pod_start_s),
    "exec": Costs(exec_latency_s=CONTROL_PLANE.exec_latency_s),
    "api": Costs(api_qps=5.0, api_burst=10),
    "dispatch": Costs(dispatch_s=CONTROL_PLANE.dispatch_s),
}
"""One control-plane cost alone per preset (the others off)."""

PRESETS: dict[str, Costs] = {"sched": SCHEDULING_ONLY, "cp": CONTROL_PLANE, **SINGLE}
"""Cost presets by the label used in reports: scheduling effects alone, control plane, and one
cost at a time."""

LABELS: dict[str, str] = {
    "sched": "scheduling effects alone",
    "cp": "with control-plane costs",
    "pods110": "pod cap 110 per node alone",
    "pods256": "pod cap 256 per node alone",
    "podstart": "pod start 2 s alone",
    "exec": "per-exec latency alone",
    "api": "API rate 5 QPS alone",
    "dispatch": "pooled dispatch cost alone",
    "real": "real stack",
    "sim": "simulated, same workload and node",
}


def charged(costs: Costs, pooled: bool) -> Costs:
    """The part of ``costs`` a system pays: a pooled system the dispatch cost alone, the
    static per-trajectory one every other flag. Two presets that agree here give that system
    the same run."""
    return Costs(dispatch_s=costs.dispatch_s) if pooled else replace(costs, dispatch_s=0.0)


def describe(costs: Costs) -> list[tuple[str, str, str]]:
    """(flag, value, source) rows for a report: every flag the preset charges (``api_burst``
    only with ``api_qps``)."""
    charged = [f for f in fields(costs) if getattr(costs, f.name) not in (0.0, None)
               and (f.name != "api_burst" or costs.api_qps is not None)]
    return [(f.name, str(getattr(costs, f.name)), SOURCES[f.name]) for f in charged]
