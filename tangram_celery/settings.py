"""One frozen settings object, read from ``TANGRAM_``-prefixed environment variables.

Nothing else in the project reads the environment: build a :class:`Settings` once (``from_env``)
and pass it explicitly. Building it opens no connection.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from tangram_celery.errors import ConfigError

PREFIX = "TANGRAM_"
SCHEDULERS = ("robust", "elastic", "fcfs-min")
ACTUATORS = ("local", "kubernetes")
WORKLOAD_KINDS = ("statefulset", "deployment")
T = TypeVar("T")


@dataclass(frozen=True)
class Settings:
    """Every tunable of tangram-celery; each field ``x`` is read from ``TANGRAM_X``."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    result_url: str = ""
    sandbox_backend: str = "bwrap"
    sandbox_docker_url: str = "unix:///var/run/docker.sock"
    sandbox_docker_image: str = "tangram-sandbox:bookworm-1"
    sandbox_idle_ttl_s: float = 900.0
    sandbox_warm_pool_min: int = 1
    sandbox_warm_pool_max: int = 8
    sandbox_ready: int = 2
    sandbox_root: Path = Path("/var/tmp/tangram-sandboxes")  # nosec B108 # default root; world-traversable for sandbox uids, not a temp file
    sandbox_uid_base: int = 1_500_000
    sandbox_memory_mb: int = 512
    sandbox_pids: int = 128
    sandbox_file_size_mb: int = 64
    sandbox_workdir_mb: int = 256
    sandbox_tmp_mb: int = 64
    output_cap_bytes: int = 65536
    default_timeout_s: float = 60.0
    max_timeout_s: float = 900.0
    visibility_margin_s: float = 600.0
    recovery_audit_s: float = 5.0
    stranded_after_s: float = 120.0
    max_payload_bytes: int = 262144
    trajectory_memory_mb: int = 512
    node_heartbeat_s: float = 2.0
    node_ttl_s: float = 10.0
    result_ttl_s: int = 86400
    trajectory_ttl_s: int = 6 * 3600
    admission_window: int = 0
    flower_address: str = "127.0.0.1"
    flower_port: int = 5555
    flower_user: str = "tangram"
    flower_password: str = ""
    exporter_address: str = "127.0.0.1"
    exporter_port: int = 9808
    gateway_address: str = "127.0.0.1"
    gateway_port: int = 8080
    gateway_token: str = ""
    gateway_wait_s: float = 600.0
    gateway_trajectory_idle_s: float = 900.0
    gateway_pytest_max_cores: int = 4
    gateway_languages: tuple[str, ...] = field(default_factory=tuple)
    scheduler: str = "robust"
    scheduler_depth: int = 2
    durations_sync_s: float = 1.0
    triton_url: str = "http://127.0.0.1:8000"
    triton_protocol: str = "http"
    triton_repository: Path = Path("triton_models")
    triton_retry_s: float = 30.0
    reward_max_batch: int = 16
    gpu_simulated: bool = True
    gpu_memory_mb: int = 81920
    gpu_restore_s: float = 2.0
    api_limits: str = ""
    api_bypass_s: float = 60.0
    autoscale_interval_s: float = 1.0
    autoscale_node_cores: int = 2
    autoscale_node_memory_mb: float = 8192.0
    autoscale_min_nodes: int = 1
    autoscale_max_nodes: int = 8
    autoscale_budget_cores: int = 0
    autoscale_target_wait_s: float = 2.0
    autoscale_down_hold_s: float = 20.0
    autoscale_drain_timeout_s: float = 600.0
    autoscale_actuator: str = "local"
    kubernetes_namespace: str = "tangram"
    kubernetes_cpu_workload: str = "statefulset/tangram-cpu-node"
    dashboard_address: str = "127.0.0.1"
    dashboard_port: int = 9810
    dashboard_user: str = "tangram"
    dashboard_password: str = ""
    extra_resources: tuple[str, ...] = field(default_factory=tuple)
    clock_skew_s: float = 0.0

    @property
    def result_backend_url(self) -> str:
        """The result backend DSN: ``TANGRAM_RESULT_URL`` or else the broker's."""
        return self.result_url or self.redis_url

    @property
    def visibility_timeout_s(self) -> int:
        """Redis visibility timeout: the longest allowed action plus a margin for its wait in a
        node's admission window, so a running action is never delivered twice (celery#5935)."""
        return int(self.max_timeout_s + self.visibility_margin_s)

    @property
    def restore_interval_s(self) -> int:
        """How often workers sweep for messages of dead workers to deliver again."""
        return max(1, min(10, self.visibility_timeout_s // 4))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read every field from ``TANGRAM_<FIELD>`` in ``env`` (default: ``os.environ``).

        Unknown ``TANGRAM_`` variables raise :class:`ConfigError`, so a typo is never silent.
        """
        source = dict(os.environ if env is None else env)
        known = {f.name for f in fields(cls)}
        unknown = sorted(
            k for k in source if k.startswith(PREFIX) and k[len(PREFIX):].lower() not in known
            and k not in _IGNORED
        )
        if unknown:
            raise ConfigError(
                f"unknown setting(s) {', '.join(unknown)}; known: "
                + ", ".join(PREFIX + n.upper() for n in sorted(known))
            )
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = source.get(PREFIX + f.name.upper())
            if raw is not None:
                values[f.name] = _parse(f.name, raw, _PARSERS[f.name])
        values.update(overrides)
        settings = cls(**values)
        settings.check()
        return settings

    def with_(self, **changes: Any) -> Settings:
        """A copy with some fields changed, checked again."""
        new = replace(self, **changes)
        new.check()
        return new

    def check(self) -> None:
        """Raise :class:`ConfigError` if a combination of values is unusable."""
        for url_field in ("redis_url", "result_url"):
            url = getattr(self, url_field)
            if url and urlsplit(url).scheme not in {"redis", "rediss", "unix"}:
                raise ConfigError(
                    f"{PREFIX}{url_field.upper()}={url!r}: expected redis://[:password@]host:port/db"
                )
        if self.sandbox_backend not in {"bwrap", "docker"}:
            raise ConfigError(
                f"{PREFIX}SANDBOX_BACKEND={self.sandbox_backend!r}: choose 'bwrap' or 'docker'"
            )
        if self.sandbox_uid_base < 1000:
            raise ConfigError(
                f"{PREFIX}SANDBOX_UID_BASE={self.sandbox_uid_base}: sandboxes never run as root "
                "or a system account; use a free range such as 1500000"
            )
        if not 0 <= self.sandbox_ready <= 64:
            raise ConfigError(
                f"{PREFIX}SANDBOX_READY={self.sandbox_ready}: keep 0 to 64 sandboxes started "
                "ahead (0 starts each trajectory's sandbox on demand)"
            )
        if not 0 < self.default_timeout_s <= self.max_timeout_s:
            raise ConfigError(
                f"{PREFIX}DEFAULT_TIMEOUT_S must be > 0 and <= {PREFIX}MAX_TIMEOUT_S"
            )
        if self.scheduler not in SCHEDULERS:
            raise ConfigError(
                f"{PREFIX}SCHEDULER={self.scheduler!r}: choose one of {', '.join(SCHEDULERS)}"
            )
        if self.triton_protocol not in {"http", "grpc"}:
            raise ConfigError(f"{PREFIX}TRITON_PROTOCOL={self.triton_protocol!r}: http or grpc")
        for name in ("max_payload_bytes", "output_cap_bytes", "trajectory_memory_mb"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{PREFIX}{name.upper()} must be positive")
        self._validate_autoscale()
        if self.stranded_after_s and self.stranded_after_s < self.node_ttl_s:
            raise ConfigError(
                f"{PREFIX}STRANDED_AFTER_S={self.stranded_after_s:g} must be 0 (off) or at least "
                f"{PREFIX}NODE_TTL_S={self.node_ttl_s:g}"
            )
        if self.durations_sync_s < 0:
            raise ConfigError(f"{PREFIX}DURATIONS_SYNC_S must be >= 0 (0: each node learns "
                              "durations alone)")
        if self.recovery_audit_s < 0:
            raise ConfigError(f"{PREFIX}RECOVERY_AUDIT_S must be >= 0 (0 turns the audit off)")
        if self.gpu_restore_s < 0:
            raise ConfigError(f"{PREFIX}GPU_RESTORE_S must be >= 0 (seconds a model load takes)")
        if self.api_bypass_s < 0:
            raise ConfigError(f"{PREFIX}API_BYPASS_S must be >= 0 (0: plain FCFS by arrival)")
        for name in ("gateway_wait_s", "gateway_trajectory_idle_s", "gateway_pytest_max_cores"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{PREFIX}{name.upper()} must be positive")


    def _validate_autoscale(self) -> None:
        positive = ("autoscale_interval_s", "autoscale_node_cores", "autoscale_node_memory_mb",
                    "autoscale_target_wait_s", "autoscale_drain_timeout_s")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{PREFIX}{name.upper()} must be positive")
        for name in ("autoscale_budget_cores", "autoscale_down_hold_s", "autoscale_min_nodes"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{PREFIX}{name.upper()} must be >= 0")
        if self.autoscale_max_nodes < max(self.autoscale_min_nodes, 1):
            raise ConfigError(
                f"{PREFIX}AUTOSCALE_MAX_NODES={self.autoscale_max_nodes} must be >= 1 and >= "
                f"{PREFIX}AUTOSCALE_MIN_NODES={self.autoscale_min_nodes}"
            )
        if self.autoscale_actuator not in ACTUATORS:
            raise ConfigError(
                f"{PREFIX}AUTOSCALE_ACTUATOR={self.autoscale_actuator!r}: choose one of "
                + ", ".join(ACTUATORS)
            )
        kind, _, name = self.kubernetes_cpu_workload.partition("/")
        if kind not in WORKLOAD_KINDS or not name:
            raise ConfigError(
                f"{PREFIX}KUBERNETES_CPU_WORKLOAD={self.kubernetes_cpu_workload!r}: expected "
                "statefulset/NAME or deployment/NAME"
            )


def _parse_bool(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError("expected true/false")


def _parse_tuple(raw: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in raw.split(",") if part.strip())


_IGNORED = {"TANGRAM_UNITS"}
_BY_TYPE: dict[str, Callable[[str], Any]] = {
    "str": str,
    "Path": Path,
    "int": int,
    "float": float,
    "bool": _parse_bool,
    "tuple[str, ...]": _parse_tuple,
}
_PARSERS: dict[str, Callable[[str], Any]] = {
    f.name: _BY_TYPE[str(f.type)] for f in fields(Settings)
}


def _parse(name: str, raw: str, parser: Callable[[str], T]) -> T:
    try:
        return parser(raw)
    except ValueError as exc:
        raise ConfigError(f"{PREFIX}{name.upper()}={raw!r}: {exc}") from None
