"""The sections of the action path: the broker, what actions may ask for, the client, the sandbox
and every pool worker."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from tangram_celery.errors import ConfigError
from tangram_celery.settings.field import PREFIX, positive, setting

SCHEDULERS = ("robust", "elastic", "fcfs-min")
FENCE_MODES = ("finish", "kill")
WEIGHTINGS = ("equi", "absolute", "shortest", "relative")


@dataclass(frozen=True)
class BrokerSettings:
    """Redis: the Celery broker and result backend, and every record the parts share."""

    redis_url: str = setting("redis://127.0.0.1:6379/0", "REDIS_URL")
    result_url: str = setting("", "RESULT_URL")
    result_ttl_s: int = setting(86400, "RESULT_TTL_S")
    visibility_margin_s: float = setting(600.0, "VISIBILITY_MARGIN_S")
    clock_skew_s: float = setting(0.0, "CLOCK_SKEW_S")
    master_name: str = setting("tangram", "REDIS_MASTER_NAME")
    sentinel_password: str = setting("", "REDIS_SENTINEL_PASSWORD")
    wait_replicas: int = setting(1, "REDIS_WAIT_REPLICAS")
    wait_ms: int = setting(1000, "REDIS_WAIT_MS")
    retry_s: float = setting(30.0, "REDIS_RETRY_S")
    timeout_s: float = setting(5.0, "REDIS_TIMEOUT_S")

    @property
    def result_backend_url(self) -> str:
        """The result backend DSN: ``TANGRAM_RESULT_URL`` or else the broker's."""
        return self.result_url or self.redis_url

    @property
    def sentinel(self) -> bool:
        """Whether the broker is a Sentinel-managed Redis (a ``sentinel://`` URL)."""
        return urlsplit(self.redis_url).scheme == "sentinel"

    def check(self) -> None:
        """Raise :class:`ConfigError` if a value is unusable."""
        for name in ("redis_url", "result_url"):
            url = getattr(self, name)
            if url and urlsplit(url).scheme not in {"redis", "rediss", "unix", "sentinel"}:
                raise ConfigError(
                    f"{PREFIX}{name.upper()}={url!r}: expected redis://[:password@]host:port/db "
                    "or sentinel://[:password@]host:port[,host:port...]/db")
        if self.sentinel and not self.master_name:
            raise ConfigError(f"{PREFIX}REDIS_MASTER_NAME must name the Sentinel-managed master")
        if self.wait_replicas < 0 or self.wait_ms < 0:
            raise ConfigError(f"{PREFIX}REDIS_WAIT_REPLICAS and {PREFIX}REDIS_WAIT_MS must be "
                              ">= 0 (0 replicas: no WAIT)")
        positive(self, "timeout_s")
        if self.retry_s < 0:
            raise ConfigError(f"{PREFIX}REDIS_RETRY_S must be >= 0 (0: never retry)")


@dataclass(frozen=True)
class ActionSettings:
    """What an action may ask for, and how long a trajectory keeps its place."""

    default_timeout_s: float = setting(60.0, "DEFAULT_TIMEOUT_S")
    max_timeout_s: float = setting(900.0, "MAX_TIMEOUT_S")
    max_payload_bytes: int = setting(262144, "MAX_PAYLOAD_BYTES")
    trajectory_memory_mb: int = setting(512, "TRAJECTORY_MEMORY_MB")
    trajectory_ttl_s: int = setting(6 * 3600, "TRAJECTORY_TTL_S")
    extra_resources: tuple[str, ...] = setting((), "EXTRA_RESOURCES")

    def check(self) -> None:
        """Raise :class:`ConfigError` if a value is unusable."""
        if not 0 < self.default_timeout_s <= self.max_timeout_s:
            raise ConfigError(f"{PREFIX}DEFAULT_TIMEOUT_S must be > 0 and <= {PREFIX}MAX_TIMEOUT_S")
        positive(self, "max_payload_bytes", "trajectory_memory_mb")


@dataclass(frozen=True)
class ClientSettings:
    """How a waiting client finds actions that the broker or a node lost."""

    recovery_audit_s: float = setting(5.0, "RECOVERY_AUDIT_S")
    stranded_after_s: float = setting(120.0, "STRANDED_AFTER_S")

    def check(self) -> None:
        """Raise :class:`ConfigError` if a value is unusable."""
        if self.recovery_audit_s < 0:
            raise ConfigError(f"{PREFIX}RECOVERY_AUDIT_S must be >= 0 (0 turns the audit off)")


@dataclass(frozen=True)
class SandboxSettings:
    """Where CPU actions run: the backend and the limits of every sandbox."""

    backend: str = setting("bwrap", "SANDBOX_BACKEND")
    docker_url: str = setting("unix:///var/run/docker.sock", "SANDBOX_DOCKER_URL")
    docker_image: str = setting("tangram-sandbox:bookworm-1", "SANDBOX_DOCKER_IMAGE")
    idle_ttl_s: float = setting(900.0, "SANDBOX_IDLE_TTL_S")
    warm_pool_min: int = setting(1, "SANDBOX_WARM_POOL_MIN")
    warm_pool_max: int = setting(8, "SANDBOX_WARM_POOL_MAX")
    ready: int = setting(2, "SANDBOX_READY")
    recycle: int = setting(8, "SANDBOX_RECYCLE")
    root: Path = setting(Path("/var/tmp/tangram-sandboxes"), "SANDBOX_ROOT")  # nosec B108 # default root; world-traversable for sandbox uids, not a temp file
    uid_base: int = setting(1_500_000, "SANDBOX_UID_BASE")
    memory_mb: int = setting(512, "SANDBOX_MEMORY_MB")
    pids: int = setting(128, "SANDBOX_PIDS")
    file_size_mb: int = setting(64, "SANDBOX_FILE_SIZE_MB")
    workdir_mb: int = setting(256, "SANDBOX_WORKDIR_MB")
    tmp_mb: int = setting(64, "SANDBOX_TMP_MB")
    output_cap_bytes: int = setting(65536, "OUTPUT_CAP_BYTES")
    enforce: str = setting("strict", "SANDBOX_ENFORCE")

    def check(self) -> None:
        """Raise :class:`ConfigError` if a value is unusable."""
        if self.backend not in {"bwrap", "docker"}:
            raise ConfigError(
                f"{PREFIX}SANDBOX_BACKEND={self.backend!r}: choose 'bwrap' or 'docker'")
        if self.uid_base < 1000:
            raise ConfigError(
                f"{PREFIX}SANDBOX_UID_BASE={self.uid_base}: sandboxes never run as root "
                "or a system account; use a free range such as 1500000")
        if not 0 <= self.ready <= 64:
            raise ConfigError(
                f"{PREFIX}SANDBOX_READY={self.ready}: keep 0 to 64 sandboxes started "
                "ahead (0 starts each trajectory's sandbox on demand)")
        if not 0 <= self.recycle <= 256:
            raise ConfigError(
                f"{PREFIX}SANDBOX_RECYCLE={self.recycle}: keep 0 to 256 wiped sandboxes for "
                "one-request trajectories (0 starts and removes one per request)")
        if self.enforce not in {"strict", "best-effort"}:
            raise ConfigError(
                f"{PREFIX}SANDBOX_ENFORCE={self.enforce!r}: 'strict' (a node refuses to start "
                "when it cannot enforce cores and memory) or 'best-effort' (it runs, and says "
                "what is not enforced)")
        positive(self, "output_cap_bytes")


@dataclass(frozen=True)
class NodeSettings:
    """Every pool worker: its heartbeat, its admission window and its placement policy."""

    heartbeat_s: float = setting(2.0, "NODE_HEARTBEAT_S")
    ttl_s: float = setting(10.0, "NODE_TTL_S")
    admission_window: int = setting(0, "ADMISSION_WINDOW")
    scheduler: str = setting("robust", "SCHEDULER")
    scheduler_depth: int = setting(2, "SCHEDULER_DEPTH")
    durations_sync_s: float = setting(1.0, "DURATIONS_SYNC_S")
    fence_running: str = setting("finish", "FENCE_RUNNING")
    malleable_resize: bool = setting(True, "MALLEABLE_RESIZE")
    malleable_tick_s: float = setting(1.0, "MALLEABLE_TICK_S")
    malleable_start_s: float = setting(1.0, "MALLEABLE_START_S")
    malleable_weighting: str = setting("equi", "MALLEABLE_WEIGHTING")

    def check(self) -> None:
        """Raise :class:`ConfigError` if a value is unusable."""
        if self.fence_running not in FENCE_MODES:
            raise ConfigError(f"{PREFIX}FENCE_RUNNING={self.fence_running!r}: choose one of "
                              + ", ".join(FENCE_MODES))
        if self.scheduler not in SCHEDULERS:
            raise ConfigError(
                f"{PREFIX}SCHEDULER={self.scheduler!r}: choose one of {', '.join(SCHEDULERS)}")
        if self.durations_sync_s < 0:
            raise ConfigError(f"{PREFIX}DURATIONS_SYNC_S must be >= 0 (0: each node learns "
                              "durations alone)")
        if self.malleable_weighting not in WEIGHTINGS:
            raise ConfigError(f"{PREFIX}MALLEABLE_WEIGHTING={self.malleable_weighting!r}: "
                              f"choose one of {', '.join(WEIGHTINGS)}")
        if self.malleable_start_s < 0:
            raise ConfigError(f"{PREFIX}MALLEABLE_START_S must be >= 0")
        positive(self, "malleable_tick_s")
