"""One ``tritonserver`` process on a model repository: its start, readiness and stop.

How it runs:

* ``--model-control-mode=explicit``: nothing is loaded unless asked (``models``) or loaded later
  through the repository API; ports are free loopback ports unless given; the python backend gets
  a shared-memory prefix of its own so several servers can share a machine;
  ``--disable-auto-complete-config`` (our configs are complete): a python-backend load then starts
  one stub process per instance instead of an extra one for auto-completion (~0.3 s, not ~1.5 s);
* stdout and stderr go to a log file (CUDA/NVML/DCGM warnings there are harmless on CPU);
* with a ``key`` (``TANGRAM_TRITON_KEY``) the control APIs (:data:`RESTRICTED_APIS`: the model
  repository, which accepts uploaded model files, shared memory, trace and logging settings)
  answer only requests carrying it in the ``tangram-triton-key`` header, over HTTP and gRPC;
  inference, health and metadata stay open. Without a key the server listens on loopback only.
  ``tritonserver`` reads the key from its command line alone (no file or environment
  variable), so once the server answers, the key is blanked in its argument area
  (:func:`~tangram_celery.credentials.hide_argument`): ``ps`` and ``/proc/PID/cmdline`` show
  ``*`` from then on, though not during the second or so the server takes to start.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from tangram_celery.credentials import hide_argument, require_credential
from tangram_celery.errors import ServiceError
from tangram_celery.processes import free_ports
from tangram_celery.reward.server.distribution import (
    TritonDistribution,
    assemble_backends,
    find_distribution,
    python_library_dir,
    server_env,
)

LOG_TAIL_CHARS = 3000
LOAD_THREADS = 16
"""Concurrent model loads (Triton's default of 4 queues the restores of a GPU pool that loads
services on several chunks at once: 8 one-instance loads took 4.7 s with 4, 2.4 s with 16)."""
KEY_HEADER = "tangram-triton-key"
"""The header carrying ``TANGRAM_TRITON_KEY`` on Triton's restricted (control) APIs."""
GRPC_KEY_HEADER = f"triton-grpc-protocol-{KEY_HEADER}"
"""The same over gRPC: Triton prefixes a restricted protocol's header name this way."""
RESTRICTED_APIS = ("model-repository", "shared-memory", "trace", "logging")
"""Triton's APIs that change the server (load uploaded model code, map memory, write trace
and log files): behind the key when there is one."""


@dataclass(frozen=True)
class ServerPorts:
    """The three ports of one server."""

    http: int
    grpc: int
    metrics: int

    @classmethod
    def pick(cls, host: str = "127.0.0.1") -> ServerPorts:
        """Three distinct free ports (tritonserver refuses to start on one port twice)."""
        http, grpc, metrics = free_ports(3, host)
        return cls(http, grpc, metrics)


class TritonServer:
    """One ``tritonserver`` process on a model repository, in explicit model-control mode.

    Use as a context manager (``with TritonServer(repo) as server: server.http_url``) or call
    :meth:`start` and :meth:`stop`. ``python_prefix`` is the (virtual) environment whose packages
    the models import; it defaults to the running interpreter's. On stop the server drains for up
    to ``exit_timeout_s`` (in-flight requests, open client connections: close your clients).
    ``key`` restricts the control APIs to clients that send it (see the module); a ``host``
    off loopback is refused without one.
    """

    def __init__(
        self,
        model_repository: Path | str,
        *,
        host: str = "127.0.0.1",
        ports: ServerPorts | None = None,
        workdir: Path | None = None,
        log_path: Path | None = None,
        models: Sequence[str] = (),
        python_prefix: Path | None = None,
        base_env: Mapping[str, str] | None = None,
        startup_timeout_s: float = 120.0,
        stop_timeout_s: float = 30.0,
        exit_timeout_s: int = 10,
        extra_args: Sequence[str] = (),
        key: str = "",
    ) -> None:
        self.model_repository = Path(model_repository).resolve()
        self.host = host
        self._fixed_ports = ports
        self.ports = ports or ServerPorts(0, 0, 0)
        self._workdir = workdir
        self._log_path = log_path
        self.models = tuple(models)
        self.python_prefix = python_prefix or Path(sys.prefix)
        self._base_env = base_env
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.exit_timeout_s = exit_timeout_s
        self.extra_args = tuple(extra_args)
        self.key = key
        self.key_hidden = False
        self._process: subprocess.Popen[bytes] | None = None
        self._own_workdir: Path | None = None

    @property
    def http_url(self) -> str:
        """``host:port`` of the HTTP endpoint (the form ``tritonclient.http`` takes)."""
        return f"{self.host}:{self.ports.http}"

    @property
    def grpc_url(self) -> str:
        """``host:port`` of the gRPC endpoint (the form ``tritonclient.grpc`` takes)."""
        return f"{self.host}:{self.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        """The Prometheus metrics address."""
        return f"http://{self.host}:{self.ports.metrics}/metrics"

    @property
    def log_path(self) -> Path:
        """Where the server's stdout and stderr go."""
        if self._log_path is not None:
            return self._log_path
        return self.workdir / "tritonserver.log"

    @property
    def workdir(self) -> Path:
        """The directory holding the assembled backends (a temporary one unless given)."""
        if self._workdir is not None:
            return self._workdir
        if self._own_workdir is None:
            self._own_workdir = Path(tempfile.mkdtemp(prefix="tangram-triton-"))
        return self._own_workdir

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self._process.pid if self._process is not None else None

    def running(self) -> bool:
        """Whether the process is alive."""
        return self._process is not None and self._process.poll() is None

    def start(self) -> TritonServer:
        """Start the server and wait until it is ready; raise :class:`ServiceError` if it is not.

        With automatic ports, a start that loses a port race is retried on new ports.
        """
        if self.running():
            return self
        require_credential(self.host, self.key, "tritonserver",
                           "set TANGRAM_TRITON_KEY (its control APIs then need the key)")
        if not self.model_repository.is_dir():
            raise ServiceError(f"model repository {self.model_repository} is not a directory")
        dist = find_distribution()
        backends = assemble_backends(dist, self.workdir / "backends")
        attempts = 1 if self._fixed_ports else 3
        for attempt in range(attempts):
            self.ports = self._fixed_ports or ServerPorts.pick(self.host)
            self._spawn(dist, backends)
            try:
                self._wait_ready()
                self.key_hidden = self.pid is not None and hide_argument(self.pid, self.key)
                return self
            except ServiceError:
                self._terminate()
                if attempt + 1 == attempts or "already in use" not in self.log_tail():
                    raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL of its process group after the timeout)."""
        self._terminate()
        if self._own_workdir is not None:  # keep the log, drop the copied backends
            shutil.rmtree(self._own_workdir / "backends", ignore_errors=True)

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        """The last ``chars`` characters of the server log."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    @property
    def shm_prefix(self) -> str:
        """The python backend's shared-memory region prefix, unique to this server."""
        return f"tangram{os.getpid()}p{self.ports.http}_"

    def command(self, binary: Path, backends: Path) -> list[str]:
        """The command line the server is started with."""
        cmd = [
            str(binary),
            f"--model-repository={self.model_repository}",
            f"--backend-directory={backends}",
            "--model-control-mode=explicit",
            f"--http-address={self.host}",
            f"--http-port={self.ports.http}",
            f"--grpc-address={self.host}",
            f"--grpc-port={self.ports.grpc}",
            f"--metrics-address={self.host}",
            f"--metrics-port={self.ports.metrics}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            "--disable-auto-complete-config",
            "--strict-readiness=false",
            f"--exit-timeout-secs={self.exit_timeout_s}",
        ]
        cmd += [f"--load-model={name}" for name in self.models]
        cmd += restriction_args(self.key)
        if not any(a.startswith("--model-load-thread-count") for a in self.extra_args):
            cmd.append(f"--model-load-thread-count={LOAD_THREADS}")
        return cmd + list(self.extra_args)

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _spawn(self, dist: TritonDistribution, backends: Path) -> None:
        base = dict(os.environ) if self._base_env is None else dict(self._base_env)
        env = server_env(dist, self.python_prefix, python_library_dir(), base)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                self.command(dist.binary, backends),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        url = f"http://{self.http_url}/v2/health/ready"
        while time.monotonic() < deadline:
            if not self.running():
                raise ServiceError(
                    f"tritonserver exited during startup (see {self.log_path}):\n{self.log_tail()}"
                )
            if _http_ok(url):
                return
            time.sleep(0.1)
        raise ServiceError(
            f"tritonserver not ready after {self.startup_timeout_s:.0f} s (see {self.log_path}):\n"
            f"{self.log_tail()}"
        )

    def _terminate(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        # Stubs of models that were still loading may outlive the server (also one that
        # crashed: they then hold its clients' connections open); they share its group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        for region in Path("/dev/shm").glob(f"{self.shm_prefix}*"):  # nosec B108 # unlinks only this server's own shm regions (unique prefix)
            with contextlib.suppress(OSError):
                region.unlink()


def restriction_args(key: str) -> list[str]:
    """The arguments putting :data:`RESTRICTED_APIS` behind ``key`` (none without a key)."""
    if not key:
        return []
    apis = ",".join(RESTRICTED_APIS)
    return [f"--http-restricted-api={apis}:{KEY_HEADER}={key}",
            f"--grpc-restricted-protocol={apis}:{KEY_HEADER}={key}"]


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:  # nosec B310 # url is http://HOST:PORT/v2/health/ready built here
            return int(response.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def triton_ready(url: str) -> bool:
    """Whether the Triton server at ``url`` (``http://host:port`` or ``host:port``) is ready."""
    base = url if "://" in url else f"http://{url}"
    return _http_ok(base.rstrip("/") + "/v2/health/ready")
