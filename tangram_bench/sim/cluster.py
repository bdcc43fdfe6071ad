"""The simulated hardware and the physical costs that every system pays.

Defaults are the paper's scale: a CPU cluster of 15 nodes x 256 cores and a GPU cluster of
5 nodes x 8 GPUs (80 GB each). GPU model restore time is explicit: loading a service of
``weights_gb`` on ``dop`` GPUs takes ``load_init_s + weights_gb / (dop * restore_gbps)``
(each GPU restores its shard in parallel from host memory; ``restore_gbps`` per GPU and the
engine initialisation time are assumptions, flags). A quota-limited API answers an over-quota
call with a rejection after ``reject_s``; clients that call it directly retry with exponential
backoff and full jitter (sleep uniform in [0, min(cap, base * 2**attempt)]), the usual client
practice.
"""

from __future__ import annotations

from dataclasses import dataclass

from tangram_bench.workloads.model import GpuService


@dataclass(frozen=True)
class Cluster:
    """Hardware and physical costs of one simulated run."""

    cpu_nodes: int = 15
    cores_per_node: int = 256
    numa_per_node: int = 2
    gpu_nodes: int = 5
    gpus_per_node: int = 8
    gpu_memory_gb: float = 80.0
    restore_gbps: float = 10.0
    load_init_s: float = 2.0
    reject_s: float = 0.05
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 20.0

    def __post_init__(self) -> None:
        if self.cpu_nodes < 1 or self.cores_per_node < 1 or self.gpu_nodes < 1:
            raise ValueError("a cluster needs at least one CPU node and one GPU node")
        if self.cores_per_node % self.numa_per_node:
            raise ValueError("cores_per_node must be a multiple of numa_per_node")

    @property
    def cores(self) -> int:
        """CPU cores in all."""
        return self.cpu_nodes * self.cores_per_node

    @property
    def gpus(self) -> int:
        """GPUs in all."""
        return self.gpu_nodes * self.gpus_per_node

    def load_s(self, service: GpuService, dop: int) -> float:
        """Seconds to restore ``service`` onto ``dop`` GPUs."""
        return self.load_init_s + service.weights_gb / (dop * self.restore_gbps)

    def physics(self) -> list[tuple[str, str, str]]:
        """(flag, value, source) rows of the physical costs for a report."""
        return [(name, str(getattr(self, name)), source)
                for name, source in PHYSICS_SOURCES.items()]

    @classmethod
    def with_cores(cls, cores: int, cores_per_node: int = 256) -> Cluster:
        """A default cluster with ``cores`` CPU cores (a multiple of ``cores_per_node``)."""
        if cores % cores_per_node:
            raise ValueError(f"cores must be a multiple of {cores_per_node}")
        return cls(cpu_nodes=cores // cores_per_node, cores_per_node=cores_per_node)


PHYSICS_SOURCES: dict[str, str] = {
    "load_init_s": (
        "fixed part of restoring a GPU service (engine start, allocator, graph capture). An "
        "assumption between the two published ends: vLLM's blog on sleep mode (2025-10-26) "
        "quotes 30-100+ s for a full reload of a model and 0.1-0.4 s to wake a sleeping one "
        "whose weights stay in host memory; lower it to model a sleep-mode restore"
    ),
    "restore_gbps": (
        "host-to-GPU copy rate per GPU for the weights (each GPU of a chunk copies its shard "
        "in parallel); 10 GB/s is an assumption below PCIe Gen4/Gen5 x16 peak (32/64 GB/s)"
    ),
    "reject_s": "latency of a rejected (HTTP 429) API call: an assumption",
    "backoff_base_s": (
        "client retry: exponential backoff with full jitter, sleep uniform in "
        "[0, min(cap, base * 2**attempt)] (the AWS Architecture Blog's 'Exponential Backoff "
        "And Jitter'); base and cap are assumptions"
    ),
    "backoff_cap_s": "cap of the client retry backoff: an assumption",
}
"""Where the physical (always charged) costs come from."""
