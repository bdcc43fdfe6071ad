"""The sections of the services around the pools: Triton, the GPU and API pools, the gateway, the
autoscaler and the operator's views."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tangram_celery.errors import ConfigError
from tangram_celery.settings.field import PREFIX, env_name, positive, setting

ACTUATORS = ("local", "kubernetes")
KEY_CHARACTERS = re.compile(r"[A-Za-z0-9._~-]+")
WORKLOAD_KINDS = ("statefulset", "deployment")


@dataclass(frozen=True)
class TritonSettings:
    """The Triton Inference Server that GPU pools serve reward models from."""

    url: str = setting("http://127.0.0.1:8000", "TRITON_URL")
    protocol: str = setting("http", "TRITON_PROTOCOL")
    repository: Path = setting(Path("triton_models"), "TRITON_REPOSITORY")
    retry_s: float = setting(30.0, "TRITON_RETRY_S")
    key: str = setting("", "TRITON_KEY")

    def check(self) -> None:
        """Raise :class:`ConfigError` if a value is unusable."""
        if self.protocol not in {"http", "grpc"}:
            raise ConfigError(f"{PREFIX}TRITON_PROTOCOL={self.protocol!r}: http or grpc")
        if self.key and not KEY_CHARACTERS.fullmatch(self.key):
            raise ConfigError(f"{PREFIX}TRITON_KEY may hold only letters, digits, '-', '_', '.' "
                              "and '~' (it travels as an HTTP header value); generate one with "
                              "python -c 'import secrets; print(secrets.token_urlsafe(24))'")


@dataclass(frozen=True)
class GpuSettings:
    """The GPUs of a reward pool and how its scheduler treats them."""

    simulated: bool = setting(True, "GPU_SIMULATED")
    memory_mb: int = setting(81920, "GPU_MEMORY_MB")
    restore_s: float = setting(2.0, "GPU_RESTORE_S")
    reward_max_batch: int = setting(16, "REWARD_MAX_BATCH")

    def check(self) -> None:
        """Raise :class:`ConfigError` if a value is unusable."""
        if self.restore_s < 0:
            raise ConfigError(f"{PREFIX}GPU_RESTORE_S must be >= 0 (seconds a model load takes)")


@dataclass(frozen=True)
class ApiSettings:
    """Quota-limited APIs and the order their calls are served in."""

    limits: str = setting("", "API_LIMITS")
    bypass_s: float = setting(60.0, "API_BYPASS_S")

    def check(self) -> None:
        """Raise :class:`ConfigError` if a value is unusable."""
        if self.bypass_s < 0:
            raise ConfigError(f"{PREFIX}API_BYPASS_S must be >= 0 (0: plain FCFS by arrival)")


@dataclass(frozen=True)
class GatewaySettings:
    """``tangram gateway``: SandboxFusion's API on the CPU pool."""

    address: str = setting("127.0.0.1", "GATEWAY_ADDRESS")
    port: int = setting(8080, "GATEWAY_PORT")
    token: str = setting("", "GATEWAY_TOKEN")
    wait_s: float = setting(600.0, "GATEWAY_WAIT_S")
    trajectory_idle_s: float = setting(900.0, "GATEWAY_TRAJECTORY_IDLE_S")
    pytest_max_cores: int = setting(4, "GATEWAY_PYTEST_MAX_CORES")
    languages: tuple[str, ...] = setting((), "GATEWAY_LANGUAGES")
    reward_model: str = setting("answer_match", "GATEWAY_REWARD_MODEL")

    def check(self) -> None:
        """Raise :class:`ConfigError` if a value is unusable."""
        positive(self, "wait_s", "trajectory_idle_s", "pytest_max_cores")


@dataclass(frozen=True)
class AutoscaleSettings:
    """``tangram autoscaler``: the pools it sizes, its budget and what it scales."""

    interval_s: float = setting(1.0, "AUTOSCALE_INTERVAL_S")
    node_cores: int = setting(2, "AUTOSCALE_NODE_CORES")
    node_memory_mb: float = setting(8192.0, "AUTOSCALE_NODE_MEMORY_MB")
    min_nodes: int = setting(1, "AUTOSCALE_MIN_NODES")
    max_nodes: int = setting(8, "AUTOSCALE_MAX_NODES")
    budget_cores: int = setting(0, "AUTOSCALE_BUDGET_CORES")
    target_wait_s: float = setting(2.0, "AUTOSCALE_TARGET_WAIT_S")
    down_hold_s: float = setting(20.0, "AUTOSCALE_DOWN_HOLD_S")
    drain_timeout_s: float = setting(600.0, "AUTOSCALE_DRAIN_TIMEOUT_S")
    actuator: str = setting("local", "AUTOSCALE_ACTUATOR")
    kubernetes_namespace: str = setting("tangram", "KUBERNETES_NAMESPACE")
    kubernetes_cpu_workload: str = setting("statefulset/tangram-cpu-node",
                                           "KUBERNETES_CPU_WORKLOAD")

    def check(self) -> None:
        """Raise :class:`ConfigError` if a value is unusable."""
        positive(self, "interval_s", "node_cores", "node_memory_mb", "target_wait_s",
                  "drain_timeout_s")
        for name in ("budget_cores", "down_hold_s", "min_nodes"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{PREFIX}{env_name(self, name)} must be >= 0")
        if self.max_nodes < max(self.min_nodes, 1):
            raise ConfigError(
                f"{PREFIX}AUTOSCALE_MAX_NODES={self.max_nodes} must be >= 1 and >= "
                f"{PREFIX}AUTOSCALE_MIN_NODES={self.min_nodes}")
        if self.actuator not in ACTUATORS:
            raise ConfigError(
                f"{PREFIX}AUTOSCALE_ACTUATOR={self.actuator!r}: choose one of "
                + ", ".join(ACTUATORS))
        kind, _, name = self.kubernetes_cpu_workload.partition("/")
        if kind not in WORKLOAD_KINDS or not name:
            raise ConfigError(
                f"{PREFIX}KUBERNETES_CPU_WORKLOAD={self.kubernetes_cpu_workload!r}: expected "
                "statefulset/NAME or deployment/NAME")


@dataclass(frozen=True)
class ObserveSettings:
    """The operator's views: Flower, the Prometheus exporter and the dashboard."""

    flower_address: str = setting("127.0.0.1", "FLOWER_ADDRESS")
    flower_port: int = setting(5555, "FLOWER_PORT")
    flower_user: str = setting("tangram", "FLOWER_USER")
    flower_password: str = setting("", "FLOWER_PASSWORD")
    exporter_address: str = setting("127.0.0.1", "EXPORTER_ADDRESS")
    exporter_port: int = setting(9808, "EXPORTER_PORT")
    exporter_user: str = setting("tangram", "EXPORTER_USER")
    exporter_password: str = setting("", "EXPORTER_PASSWORD")
    dashboard_address: str = setting("127.0.0.1", "DASHBOARD_ADDRESS")
    dashboard_port: int = setting(9810, "DASHBOARD_PORT")
    dashboard_user: str = setting("tangram", "DASHBOARD_USER")
    dashboard_password: str = setting("", "DASHBOARD_PASSWORD")

    def check(self) -> None:
        """Raise :class:`ConfigError` if a value is unusable."""
        if not self.exporter_user or ":" in self.exporter_user:
            raise ConfigError(f"{PREFIX}EXPORTER_USER must be non-empty, without ':'")
