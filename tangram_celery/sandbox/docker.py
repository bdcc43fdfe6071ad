"""The Docker sandbox backend: one long-lived container per trajectory, one exec per action.

A trajectory's environment is a container made from a local image (see
:mod:`tangram_celery.sandbox.image`), taken from a small warm pool on its first action and
removed by ``end_trajectory`` or after an idle TTL. Its work dir ``/work`` and ``/tmp`` are tmpfs
mounts inside it, so files (and their memory) persist between the trajectory's actions.

Each action, under the trajectory's lock:

1. ``container.update`` pins the container to the action's cores (cpuset, and a CFS quota of one
   period per distinct core); when the exec is over a background task throttles the container
   back to 1% of a core, so nothing a finished action left behind can use the cores that went
   back to the pool.
2. One ``exec`` (the SDK's ``exec_create``/``exec_start`` pair that ``exec_run`` wraps; used
   directly for stdin, a socket deadline and streaming output caps) runs a small ``/bin/sh``
   wrapper as the unprivileged sandbox uid. The wrapper SIGKILLs what earlier actions left
   (``kill -9 -1``), checks that the pid cap has room, writes the spec's files (a Python
   receiver that never follows symlinks), runs ``timeout -s KILL <t> /bin/sh -c COMMAND``, kills
   everything the command left, and reports exit status, OOM kills, elapsed time and work-dir
   usage in a trailer on stderr. ``TANGRAM_UNITS`` is set and ``pytest`` becomes
   ``pytest -n <units>`` (:func:`~tangram_celery.sandbox.parallelism.rewrite_parallelism`).
3. The client reads the exec's socket with a deadline of ``timeout_s`` plus a grace, so a stuck
   engine cannot hang the worker.

Isolation: no network (``network_mode=none``), a pids cap, memory and memory+swap caps, a
read-only root, size-capped tmpfs ``/work``, ``/tmp`` and ``/dev/shm``, every capability dropped,
``no-new-privileges``, a seccomp profile with the embedded backend's deny-list (plus ``unshare``
and namespace flags of ``clone``), rlimits, and an init process (``docker-init``) that reaps
orphans and runs as a uid other than the sandbox's, so the sandbox cannot signal it.

Memory: the container's cap is ``memory_mb`` plus the work-dir quota, since ``/work`` is tmpfs
(its files are memory); ``/tmp`` and ``/dev/shm`` count against ``memory_mb``.

A container is *broken* when it cannot run the wrapper (gone, paused, pid cap exhausted by
processes the sandbox cannot kill) or stops answering (the client deadline passed, the reset
after an action failed). It is thrown away. When that shows before the command started, the
action runs once more in a fresh container; otherwise the next action gets one. The first
action in the fresh container says ``environment_replaced`` with the reason, since the
trajectory's files are gone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import re
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import docker
import docker.errors
import docker.types
import requests.exceptions

from tangram_celery.errors import (
    SandboxEngineError,
    SandboxError,
    SandboxSetupError,
    SandboxSpecError,
    WorkdirQuotaError,
)
from tangram_celery.sandbox.base import MB, UNITS_ENV, ExecOutcome, ExecSpec, SandboxLimits
from tangram_celery.sandbox.cgroup import format_cpus
from tangram_celery.sandbox.image import DEFAULT_TAG, SANDBOX_UID
from tangram_celery.sandbox.output import CappedBuffer, ReadyMarker, Sink
from tangram_celery.sandbox.owner import is_stale_tag, owner_tag
from tangram_celery.sandbox.parallelism import rewrite_parallelism
from tangram_celery.sandbox.seccomp import _NAMES as EMBEDDED_DENY_LIST
from tangram_celery.sandbox.validation import SpecFile, sandbox_env, validate_spec

log = logging.getLogger(__name__)

DEFAULT_DOCKER_URL = "unix:///var/run/docker.sock"
INSIDE_WORKDIR = "/work"
INIT_UID = 65534
CPU_PERIOD_US = 100_000
IDLE_CPU_QUOTA_US = 1_000
PIDS_OVERHEAD = 4  # docker-init, its sleep, the wrapper shell and `timeout`
MIN_FREE_PIDS = 4
WORKDIR_SLACK = MB  # the tmpfs is this much larger than the quota, so "over quota" is visible
OWNER_PREFIX = "dkr-"
LABEL_OWNER = "tangram.sandbox.owner"
LABEL_HOST = "tangram.sandbox.host"
SETUP_HELP = "run `bash scripts/run.sh setup` (it installs docker.io and debootstrap)"
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": INSIDE_WORKDIR,
    "USER": "sandbox",
    "LOGNAME": "sandbox",
    "TMPDIR": "/tmp",  # nosec B108 # inside the container: its private tmpfs
    "LANG": "C.UTF-8",
}
READY_MARKER = b"\x1etangram-ready\x1e"
_TRAILER_RE = re.compile(
    rb"\x1etangram-end (-?\d+) (\d+) (\d+) (-?\d+) ?(?:(\d+) (\d+) (\d+))?\x1e\Z"
)
_BROKEN_RE = re.compile(rb"\x1etangram-broken ([^\x1e]*)\x1e")
_FILES_ERROR_RE = re.compile(rb"\x1etangram-files-error ([^\x1e]*)\x1e")
TRAILER_HOLD = 128

# The in-container wrapper: $1 timeout, $2 command, $3 "1" when a file stream precedes stdin,
# $4 the minimum of free pids, $5 the file receiver. fd 3 is the action's stderr; the wrapper's
# own noise goes nowhere. `room N` kills what earlier actions left (`kill -9 -1` spares this
# shell) and waits, without forking, until N pids are free. The ready marker is printed by the
# forked child, so a fork that fails (pid cap) counts as "did not start".
WRAPPER = r"""exec 3>&2 2>/dev/null
pids() { c=; m=; for d in /sys/fs/cgroup/pids /sys/fs/cgroup; do
  if [ -r "$d/pids.current" ]; then read -r c < "$d/pids.current"; read -r m < "$d/pids.max"
  return; fi; done; }
spin() { read -r a _ < /proc/uptime; a=${a%.*}${a#*.}; b=$a
  while [ "$b" -le "$a" ]; do read -r b _ < /proc/uptime; b=${b%.*}${b#*.}; done; }
room() { n=0; kill -9 -1; pids
  while [ -n "$m" ] && [ "$m" != max ] && [ $((m - c)) -lt "$1" ]; do
    n=$((n + 1)); [ "$n" -gt 200 ] && return 1; spin; kill -9 -1; pids; done; }
oom() { o=0; for f in /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events; do
  [ -r "$f" ] || continue; while read -r k v; do [ "$k" = oom_kill ] && o=$v; done < "$f"
  return; done; }
if ! room "$4"; then
  printf '\036tangram-broken pid cap exhausted: %s of %s in use\036' "$c" "$m" >&3; exit 125
fi
oom; o0=$o
if [ "$3" = 1 ]; then python3 -I -S -c "$5" 2>&3 || exit 125; fi
read -r u0 _ < /proc/uptime
( exec 2>&3 3>&-; printf '\036tangram-ready\036' >&2; exec timeout -s KILL "$1" /bin/sh -c "$2" )
rc=$?
read -r u1 _ < /proc/uptime
oom; s=
if room 2; then s=$(stat -f -c '%b %f %S' /work) || s=; fi
printf '\036tangram-end %s %s %s %s %s\036' "$rc" "$o0" "$o" \
  $(( (${u1%.*} - ${u0%.*}) * 100 + 1${u1#*.} - 1${u0#*.} )) "$s" >&3
exit $rc
"""

# Writes the spec's files under /work from stdin (10-digit header length, JSON header of
# [path parts, size], then the contents), never through a symlink, exactly like
# :func:`tangram_celery.sandbox.workdir.write_files`. Reads no byte past the files.
RECEIVER = r"""
import json, os, stat
F = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
def fail(kind, where, reason):
    msg = json.dumps([kind, where, reason]).encode()
    os.write(2, b"\x1etangram-files-error " + msg + b"\x1e")
    os._exit(125)
def rd(n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(0, min(n - len(buf), 1 << 20))
        if not chunk:
            fail("spec", "files", "the file stream ended early")
        buf += chunk
    return bytes(buf)
def opendir(parent, name, where):
    try:
        return os.open(name, F, dir_fd=parent)
    except FileNotFoundError:
        pass
    except OSError as exc:
        fail("spec", where, "%r exists in the work dir and is not a directory (%s); "
             "pick another path" % (name, exc.strerror))
    try:
        os.mkdir(name, 0o755, dir_fd=parent)
    except FileExistsError:
        pass
    return os.open(name, F, dir_fd=parent)
def write(parent, name, size, where):
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            fail("spec", where, "%r is a directory in the work dir; pick another path" % name)
        os.unlink(name, dir_fd=parent)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, 0o644, dir_fd=parent)
    left = size
    while left:
        view = memoryview(rd(min(left, 1 << 20)))
        left -= len(view)
        while view:
            view = view[os.write(fd, view):]
    os.close(fd)
header = json.loads(rd(int(rd(10))))
root = os.open("/work", F)
for parts, size in header:
    where = "files[%r]" % "/".join(parts)
    d = root
    try:
        for part in parts[:-1]:
            d = opendir(d, part, where)
        write(d, parts[-1], size, where)
    except OSError as exc:
        kind = "quota" if exc.errno in (28, 122) else "spec"
        fail(kind, where, "cannot write it: %s" % exc.strerror)
"""


# ---------------------------------------------------------------------------------------------
# Pure policy: the warm pool and idle trajectories


@dataclass(frozen=True)
class WarmPoolPolicy:
    """How many ready containers to keep: between ``min_size`` and ``max_size``.

    The target covers the trajectory starts expected while one container is being created
    (the mean arrival rate over ``window_s`` times the creation time, times ``headroom``) and
    the largest burst of starts seen within one creation time in that window.
    """

    min_size: int = 1
    max_size: int = 8
    window_s: float = 60.0
    headroom: float = 2.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_size <= self.max_size:
            raise SandboxSpecError("warm_pool", "need 0 <= min_size <= max_size")
        if self.window_s <= 0 or self.headroom <= 0:
            raise SandboxSpecError("warm_pool", "window_s and headroom must be positive")


def peak_arrivals(times: Sequence[float], span: float) -> int:
    """The largest number of ``times`` (sorted) inside any interval of length ``span``."""
    best, start = 0, 0
    for end, t in enumerate(times):
        while t - times[start] > span:
            start += 1
        best = max(best, end - start + 1)
    return best


def warm_pool_target(
    arrivals: Iterable[float], now: float, create_s: float, policy: WarmPoolPolicy
) -> int:
    """The warm-pool size for trajectory-start times ``arrivals`` seen up to ``now``."""
    recent = sorted(t for t in arrivals if now - policy.window_s < t <= now)
    if not recent:
        return policy.min_size
    steady = math.ceil(len(recent) / policy.window_s * max(create_s, 0.0) * policy.headroom)
    burst = peak_arrivals(recent, max(create_s, 0.0))
    return max(policy.min_size, min(policy.max_size, max(steady, burst)))


@dataclass(frozen=True)
class PoolPlan:
    """What the pool keeper does next: create or remove this many ready containers."""

    create: int = 0
    remove: int = 0


def plan_pool(ready: int, creating: int, target: int) -> PoolPlan:
    """Reach ``target`` ready containers, counting those being created already."""
    if ready + creating < target:
        return PoolPlan(create=target - ready - creating)
    if ready > target:
        return PoolPlan(remove=ready - target)
    return PoolPlan()


def idle_expired(
    last_used: Mapping[str, float], busy: Collection[str], now: float, ttl_s: float
) -> list[str]:
    """Trajectories idle for at least ``ttl_s`` and not running an action, oldest first."""
    expired = [(t, tid) for tid, t in last_used.items() if tid not in busy and now - t >= ttl_s]
    return [tid for _, tid in sorted(expired)]


# ---------------------------------------------------------------------------------------------
# Pure configuration


def seccomp_profile(machine: str | None = None) -> str:
    """A Docker seccomp profile (JSON) with the embedded backend's deny-list.

    Everything is allowed except: the embedded list (keyring, io_uring, bpf, perf, mounts,
    namespaces...) plus ``unshare``, ``clone`` with a namespace flag, ``clone3`` (ENOSYS, so
    libc falls back to ``clone``) and AF_VSOCK sockets, all EPERM. Syscalls of a foreign ABI
    (i386, x32) kill the process.
    """
    machine = machine or platform.machine()
    arches = {"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64"}
    if machine not in arches:
        raise SandboxSetupError(f"no seccomp architecture for {machine!r}; start the docker "
                                "backend with seccomp=False to use Docker's default profile")
    ns_flags = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
                0x40000000)
    rules: list[dict[str, Any]] = [
        {"names": sorted({*EMBEDDED_DENY_LIST, "unshare"}), "action": "SCMP_ACT_ERRNO",
         "errnoRet": 1},
        {"names": ["socket"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1,
         "args": [{"index": 0, "value": 40, "valueTwo": 0, "op": "SCMP_CMP_EQ"}]},
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38},
    ]
    rules += [
        {"names": ["clone"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1,
         "args": [{"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}]}
        for flag in ns_flags
    ]
    profile = {"defaultAction": "SCMP_ACT_ALLOW", "architectures": [arches[machine]],
               "syscalls": rules}
    return json.dumps(profile, sort_keys=True)


def container_options(
    limits: SandboxLimits, labels: Mapping[str, str], seccomp: str | None
) -> dict[str, Any]:
    """Keyword arguments of ``containers.run`` for one sandbox container (minus the image)."""
    tmp = f"rw,exec,nosuid,nodev,size={limits.tmp_mb}m,mode=1777"
    work_size = limits.workdir_mb * MB + WORKDIR_SLACK
    work = f"rw,exec,nosuid,nodev,size={work_size},mode=0700,uid={SANDBOX_UID},gid={SANDBOX_UID}"
    memory = (limits.memory_mb + limits.workdir_mb) * MB + WORKDIR_SLACK
    ulimits = [
        docker.types.Ulimit(name="nofile", soft=limits.nofile, hard=limits.nofile),
        docker.types.Ulimit(name="fsize", soft=limits.file_size_mb * MB,
                            hard=limits.file_size_mb * MB),
        docker.types.Ulimit(name="data", soft=limits.memory_mb * MB, hard=limits.memory_mb * MB),
        docker.types.Ulimit(name="core", soft=0, hard=0),
    ]
    if limits.cpu_time_s is not None:
        ulimits.append(docker.types.Ulimit(name="cpu", soft=limits.cpu_time_s,
                                           hard=limits.cpu_time_s))
    security = ["no-new-privileges"] + ([f"seccomp={seccomp}"] if seccomp else [])
    return {
        "command": ["sleep", "infinity"],
        "detach": True,
        "init": True,
        "user": f"{INIT_UID}:{INIT_UID}",
        "working_dir": INSIDE_WORKDIR,
        "environment": dict(BASE_ENV),
        "labels": dict(labels),
        "network_mode": "none",
        "ipc_mode": "private",
        "read_only": True,
        "tmpfs": {INSIDE_WORKDIR: work, "/tmp": tmp},  # nosec B108 # a private tmpfs mounted in the container
        "shm_size": limits.tmp_mb * MB,
        "mem_limit": memory,
        "memswap_limit": memory,
        "pids_limit": limits.pids + PIDS_OVERHEAD,
        "cap_drop": ["ALL"],
        "security_opt": security,
        "ulimits": ulimits,
        "cpu_period": CPU_PERIOD_US,
        "cpu_quota": IDLE_CPU_QUOTA_US,
        "stop_signal": "SIGKILL",
    }


def cpu_options(cores: Sequence[int]) -> dict[str, Any]:
    """``container.update`` arguments pinning a container to ``cores`` for one action."""
    distinct = len(set(cores))
    return {"cpuset_cpus": format_cpus(cores), "cpu_period": CPU_PERIOD_US,
            "cpu_quota": distinct * CPU_PERIOD_US}


def idle_cpu_options() -> dict[str, Any]:
    """``container.update`` arguments between actions: 1% of a core."""
    return {"cpu_period": CPU_PERIOD_US, "cpu_quota": IDLE_CPU_QUOTA_US}


def exit_status(code: int | None, *, timed_out: bool) -> tuple[int | None, int | None]:
    """(exit_code, signal) in the shell convention (``128 + n`` means signal ``n``)."""
    if timed_out:
        return None, 9
    if code is None or code < 0:
        return None, None
    if 128 < code <= 128 + 64:
        return code, code - 128
    return code, None


def command_start(t0: float, marker_at: float | None, end: float, trailer: Trailer | None) -> float:
    """When the command started, on the host clock, for the setup/exec split of an outcome.

    The host stamps the ready marker when it reads it, which a loaded engine can deliver late;
    the wrapper's own clock says the command ran ``trailer.elapsed_s`` and ended before
    ``end``, so the start is no later than ``end - elapsed_s``.
    """
    start = end if marker_at is None else marker_at
    if trailer is not None:
        start = min(start, end - trailer.elapsed_s)
    return min(max(start, t0), end)


def units_of(spec: ExecSpec) -> int:
    """The unit count of a spec: its ``TANGRAM_UNITS`` if set, else one per listed core."""
    explicit = spec.env.get(UNITS_ENV)
    return int(explicit) if explicit else len(spec.cores)


# ---------------------------------------------------------------------------------------------
# Pure wire protocol


def encode_files(files: Sequence[SpecFile]) -> bytes:
    """The receiver's input: a 10-digit header length, the JSON header, then the contents."""
    header = json.dumps([[list(f.parts), len(f.data)] for f in files]).encode()
    return f"{len(header):010d}".encode() + header + b"".join(f.data for f in files)


def wrapper_argv(timeout_s: float, command: str, has_files: bool) -> list[str]:
    """The exec's argv: the wrapper with its positional parameters."""
    return ["/bin/sh", "-c", WRAPPER, "tangram", f"{timeout_s:.3f}", command,
            "1" if has_files else "0", str(MIN_FREE_PIDS), RECEIVER]


class FrameDemuxer:
    """Splits Docker's multiplexed exec stream into (stream, bytes) pieces.

    Each frame has an 8-byte header: the stream (1 stdout, 2 stderr, 3 engine error), three
    zero bytes and the big-endian payload size. Bytes that do not parse as a header (an engine
    error printed raw) are passed on as stream 3, as is everything after them.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._stream = 0
        self._left = 0
        self.raw = False

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Take bytes read from the socket; return the payload pieces they complete."""
        self._buf += data
        out: list[tuple[int, bytes]] = []
        while self._buf:
            if self.raw:
                out.append((3, bytes(self._buf)))
                self._buf.clear()
            elif self._left:
                piece = bytes(self._buf[: self._left])
                del self._buf[: len(piece)]
                self._left -= len(piece)
                out.append((self._stream, piece))
            elif len(self._buf) < 8:
                break
            elif self._buf[0] > 3 or self._buf[1:4] != b"\0\0\0":
                self.raw = True
            else:
                self._stream = self._buf[0]
                self._left = int.from_bytes(self._buf[4:8], "big")
                del self._buf[:8]
        return out

    def pending(self) -> bytes:
        """Bytes of an incomplete header left at the end of the stream."""
        return bytes(self._buf)


@dataclass(frozen=True)
class Trailer:
    """What the wrapper reported after the command: status, OOM kills, time, work-dir use."""

    exit_code: int
    oom_before: int
    oom_after: int
    elapsed_s: float
    workdir_bytes: int | None

    @property
    def oom_killed(self) -> bool:
        """Whether the kernel OOM-killed a process of the container during the command."""
        return self.oom_after > self.oom_before


def parse_trailer(data: bytes) -> tuple[bytes, Trailer | None]:
    """Split a stream's tail into (the command's bytes, the wrapper's trailer or None)."""
    match = _TRAILER_RE.search(data)
    if match is None:
        return data, None
    rc, before, after, centis, blocks, free, bsize = match.groups()
    used = None
    if blocks is not None and free is not None and bsize is not None:
        used = max(int(blocks) - int(free), 0) * int(bsize)
    trailer = Trailer(int(rc), int(before), int(after), int(centis) / 100.0, used)
    return data[: match.start()], trailer


@dataclass
class TrailerSink:
    """Holds back the last bytes of stderr until the end, where the wrapper's trailer sits."""

    inner: Sink
    hold: int = TRAILER_HOLD
    tail: bytearray = field(default_factory=bytearray)
    trailer: Trailer | None = None

    def feed(self, chunk: bytes, now: float) -> None:
        """Pass on everything but the last ``hold`` bytes."""
        self.tail += chunk
        if len(self.tail) > self.hold:
            cut = len(self.tail) - self.hold
            self.inner.feed(bytes(self.tail[:cut]), now)
            del self.tail[:cut]

    def finish(self, now: float) -> Trailer | None:
        """At end of stream: strip and parse the trailer, pass on the rest."""
        rest, self.trailer = parse_trailer(bytes(self.tail))
        self.tail.clear()
        if rest:
            self.inner.feed(rest, now)
        return self.trailer


def preamble_error(preamble: bytes) -> SandboxError | None:
    """The error the wrapper reported before the command started, if any."""
    match = _FILES_ERROR_RE.search(preamble)
    if match is not None:
        try:
            kind, where, reason = json.loads(match.group(1).decode("utf-8", "replace"))
        except (ValueError, TypeError):
            kind, where, reason = "spec", "files", "the file receiver failed"
        if kind == "quota":
            return WorkdirQuotaError(f"{where}: {reason}; the work dir is full, "
                                     "end_trajectory() it and start over")
        return SandboxSpecError(str(where), str(reason))
    match = _BROKEN_RE.search(preamble)
    if match is not None:
        return _Broken(match.group(1).decode("utf-8", "replace"))
    return None


class _Broken(SandboxError):
    """The container cannot run actions any more; replace it."""


# ---------------------------------------------------------------------------------------------
# I/O: the engine


def _unix_socket_path(url: str) -> str | None:
    parts = urlsplit(url)
    if parts.scheme in ("unix", "http+unix"):
        return parts.path or None
    return None


def connect(url: str, timeout_s: float) -> docker.DockerClient:
    """A client of the engine at ``url`` that answered a ping; raises SandboxEngineError."""
    switch = "or use the embedded backend (TANGRAM_SANDBOX_BACKEND=bwrap)"
    path = _unix_socket_path(url)
    if path is not None and not os.path.exists(path):
        raise SandboxEngineError(
            f"no Docker engine socket at {path}: start dockerd (install it with {SETUP_HELP}), "
            f"point the backend's docker_url at a running engine, {switch}"
        )
    try:
        client = docker.DockerClient(base_url=url, timeout=timeout_s, max_pool_size=32)
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        text = str(exc)
        hint = ("the worker may not use the socket: run it as root or in the docker group"
                if "ermission denied" in text else "is dockerd running and answering?")
        raise SandboxEngineError(
            f"the Docker engine at {url} did not answer ({text}); {hint} {switch}"
        ) from exc
    return client


API_ERRORS: tuple[type[Exception], ...] = (
    docker.errors.DockerException, requests.exceptions.RequestException, OSError)
RESET_ERRORS: tuple[type[Exception], ...] = (*API_ERRORS, ValueError, IndexError)
KEEPER_ERRORS: tuple[type[Exception], ...] = (*API_ERRORS, SandboxError)


def _raw_socket(handle: Any) -> socket.socket:
    """The plain socket under what ``exec_start(socket=True)`` returns."""
    if isinstance(handle, socket.socket):
        return handle
    inner = getattr(handle, "_sock", None)
    if isinstance(inner, socket.socket):
        return inner
    raise SandboxSetupError(f"unsupported Docker exec socket {type(handle).__name__}; "
                            "use a unix:// or tcp:// engine URL")


def _read_ahead(handle: Any) -> bytes:
    """Stream bytes the HTTP reader may have buffered past the upgrade response headers."""
    response = getattr(handle, "_response", None)
    reader = getattr(getattr(getattr(response, "raw", None), "_fp", None), "fp", None)
    if reader is None or not hasattr(reader, "peek"):
        return b""
    try:
        buffered = reader.peek(0)
    except (OSError, ValueError):
        return b""
    if not buffered:
        return b""
    return bytes(reader.read(len(buffered)))


@dataclass
class _Exchange:
    """The exec's socket traffic: what to send, where the output goes, when to give up."""

    sock: socket.socket
    demux: FrameDemuxer
    sinks: Mapping[int, Sink]
    payload: bytes | None
    deadline: Callable[[], float]


def pump_socket(ex: _Exchange, first: bytes, clock: Callable[[], float] = time.monotonic) -> bool:
    """Send ``ex.payload`` (then half-close) while reading frames into the sinks until EOF.

    Returns False when the deadline passed first. Never blocks past the deadline.
    """
    _deliver(ex, first, clock)
    ex.sock.setblocking(False)
    view = memoryview(ex.payload) if ex.payload is not None else None
    with selectors.DefaultSelector() as sel:
        sel.register(ex.sock, _events(view))
        if view is not None and not view:
            _half_close(ex.sock, sel)
            view = None
        while True:
            remaining = ex.deadline() - clock()
            if remaining <= 0:
                return False
            for _key, mask in sel.select(min(remaining, 0.5)):
                if mask & selectors.EVENT_WRITE and view is not None:
                    view = _send_some(ex.sock, sel, view)
                if mask & selectors.EVENT_READ and not _receive(ex, clock):
                    return True


def _events(view: memoryview | None) -> int:
    return selectors.EVENT_READ | (selectors.EVENT_WRITE if view is not None else 0)


def _half_close(sock: socket.socket, sel: selectors.BaseSelector) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
    sel.modify(sock, selectors.EVENT_READ)


def _send_some(
    sock: socket.socket, sel: selectors.BaseSelector, view: memoryview
) -> memoryview | None:
    try:
        sent = sock.send(view[: 1 << 20])
    except BlockingIOError:
        return view
    except OSError:  # the process stopped reading (exited): drop the rest of stdin
        sent = len(view)
    rest = view[sent:]
    if rest:
        return rest
    _half_close(sock, sel)
    return None


def _receive(ex: _Exchange, clock: Callable[[], float]) -> bool:
    """Read once; False at end of stream."""
    try:
        data = ex.sock.recv(1 << 16)
    except BlockingIOError:
        return True
    except OSError:
        return False
    if not data:
        return False
    _deliver(ex, data, clock)
    return True


def _deliver(ex: _Exchange, data: bytes, clock: Callable[[], float]) -> None:
    for stream, piece in ex.demux.feed(data):
        sink = ex.sinks.get(stream)
        if sink is not None:
            sink.feed(piece, clock())


def diagnose(container: Any) -> str:
    """Why a container may refuse to run anything: its state, or its pid cap being full."""
    if container is None:
        return "no container"
    try:
        container.reload()
        if container.status != "running":
            return f"the container is {container.status}"
        pids = container.stats(stream=False, one_shot=True).get("pids_stats") or {}
    except API_ERRORS as exc:
        return f"the engine cannot inspect the container: {exc}"
    current, limit = pids.get("current"), pids.get("limit")
    if isinstance(current, int) and isinstance(limit, int) and limit - current < MIN_FREE_PIDS:
        return f"pid cap exhausted: {current} of {limit} in use"
    return "no output"


# ---------------------------------------------------------------------------------------------
# The backend


DockerExecOutcome = ExecOutcome
"""The docker backend's outcome; ``environment_replaced``/``replaced_reason`` say whether the
trajectory's container was replaced (its files were lost) before this action, and why."""


@dataclass
class _Env:
    """A trajectory's environment: its container and what the backend knows about it."""

    trajectory_id: str
    last_used: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    container: Any | None = None
    used: bool = False
    broken: str | None = None
    lost: str | None = None
    oom_seen: int = 0
    active: int = 0
    ended: bool = False
    exceeded: bool = False
    settle: Future[None] | None = None


@dataclass
class _Run:
    """One exec in flight: its sinks and timing."""

    stdout: CappedBuffer
    stderr: CappedBuffer
    trailer_sink: TrailerSink
    marker: ReadyMarker
    engine_err: CappedBuffer
    t_start: float
    started_at: float


class DockerBackend:
    """The Docker sandbox backend (see the module docstring). Thread-safe.

    Actions of one trajectory run one at a time (its container has one cpuset); actions of
    different trajectories run in parallel.
    """

    name = "docker"

    def __init__(
        self,
        root_dir: Path,
        limits: SandboxLimits,
        *,
        docker_url: str = DEFAULT_DOCKER_URL,
        image: str = DEFAULT_TAG,
        idle_ttl_s: float = 900.0,
        warm_pool: WarmPoolPolicy | None = None,
        api_timeout_s: float = 30.0,
        grace_s: float = 5.0,
        setup_timeout_s: float = 120.0,
        seccomp: bool = True,
        tick_s: float = 0.5,
    ) -> None:
        """Connect to the engine at ``docker_url`` and start the pool keeper.

        ``root_dir`` is kept for interface parity (work dirs live in the containers).
        Raises :class:`SandboxEngineError` when no engine answers (it never hangs: every call
        has ``api_timeout_s``) and :class:`SandboxSetupError` when ``image`` is missing.
        ``idle_ttl_s``: a trajectory idle that long loses its container. ``grace_s``: how long
        past ``timeout_s`` the client waits on an exec before it declares the container broken.
        """
        self.root_dir = Path(root_dir)
        self.limits = limits
        self.image = image
        self.idle_ttl_s = idle_ttl_s
        self.pool_policy = warm_pool if warm_pool is not None else WarmPoolPolicy()
        self.grace_s = grace_s
        self.setup_timeout_s = setup_timeout_s
        self.client = connect(docker_url, api_timeout_s)
        self.docker_url = docker_url
        self._check_image()
        self._seccomp = seccomp_profile() if seccomp else None
        self.owner = owner_tag(OWNER_PREFIX)
        self._labels = {LABEL_OWNER: self.owner, LABEL_HOST: socket.gethostname()}
        self.available_cores = frozenset(range(int(self.client.info().get("NCPU", 1))))
        self._lock = threading.Lock()
        self._envs: dict[str, _Env] = {}
        self._pool: deque[Any] = deque()
        self._creating = 0
        self._arrivals: deque[float] = deque(maxlen=4096)
        self.create_s = 0.3
        self._closed = False
        self._wake = threading.Event()
        self._background = ThreadPoolExecutor(max_workers=4, thread_name_prefix="tangram-docker")
        self.reap_stale()
        self._keeper = threading.Thread(target=self._keep, args=(tick_s,), daemon=True,
                                        name="tangram-docker-pool")
        self._keeper.start()

    # -- public interface -------------------------------------------------------------------

    def run(self, spec: ExecSpec) -> DockerExecOutcome:
        """Run ``spec`` in its trajectory's container (taking one on first use)."""
        t0 = time.monotonic()
        files = validate_spec(spec, self.limits, self.available_cores)
        env = self._enter(spec.trajectory_id)
        try:
            with env.lock:
                return self._run_locked(env, spec, files, t0)
        finally:
            self._leave(env)

    def end_trajectory(self, trajectory_id: str) -> None:
        """Remove the trajectory's container (killing a running action); idempotent."""
        self._end(trajectory_id, idle_since=None)

    def _end(self, trajectory_id: str, idle_since: float | None) -> bool:
        """End a trajectory; with ``idle_since``, only if it stayed idle since then."""
        with self._lock:
            env = self._envs.get(trajectory_id)
            if env is None:
                return False
            if idle_since is not None and (env.active or env.last_used != idle_since):
                return False
            del self._envs[trajectory_id]
            env.ended = True
            container, env.container = env.container, None
        if container is not None:
            self._discard(container)
        return True

    def trajectories(self) -> list[str]:
        """The ids of the trajectories that hold an environment now."""
        with self._lock:
            return sorted(self._envs)

    def pool_size(self) -> int:
        """How many ready containers wait in the warm pool now."""
        with self._lock:
            return len(self._pool)

    def containers(self) -> list[str]:
        """The ids of every container of this backend (trajectories' and the pool's)."""
        found = self.client.api.containers(
            all=True, filters={"label": f"{LABEL_OWNER}={self.owner}"})
        return [str(entry["Id"]) for entry in found]

    def close(self) -> None:
        """End every trajectory, empty the pool, wait for the removals; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            ids = list(self._envs)
            pool, self._pool = list(self._pool), deque()
        self._wake.set()
        self._keeper.join(timeout=30)
        for trajectory_id in ids:
            self.end_trajectory(trajectory_id)
        for container in pool:
            self._discard(container)
        self._background.shutdown(wait=True)
        with contextlib.suppress(*API_ERRORS):
            for container_id in self.containers():  # one created while we were closing
                self._remove_id(container_id)
        self.client.close()

    def reap_stale(self) -> int:
        """Remove containers of backends whose process died on this host; returns how many."""
        host = socket.gethostname()
        removed = 0
        try:
            found = self.client.api.containers(all=True, filters={"label": LABEL_OWNER})
        except API_ERRORS as exc:
            raise SandboxEngineError(f"cannot list containers at {self.docker_url}: {exc}") \
                from exc
        for entry in found:
            labels = entry.get("Labels") or {}
            if labels.get(LABEL_HOST) == host and \
                    is_stale_tag(labels.get(LABEL_OWNER, ""), OWNER_PREFIX):
                self._remove_id(str(entry["Id"]))
                removed += 1
        return removed

    def __enter__(self) -> DockerBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- trajectories -----------------------------------------------------------------------

    def _check_image(self) -> None:
        try:
            self.client.images.get(self.image)
        except docker.errors.ImageNotFound as exc:
            raise SandboxSetupError(
                f"the sandbox image {self.image!r} is not in the engine at {self.docker_url}; "
                f"build it: bash scripts/build-sandbox-image.sh --docker-url {self.docker_url} "
                f"--tag {self.image}"
            ) from exc
        except API_ERRORS as exc:
            raise SandboxEngineError(f"cannot inspect image {self.image!r}: {exc}") from exc

    def _enter(self, trajectory_id: str) -> _Env:
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox backend is closed; create a new one")
            env = self._envs.get(trajectory_id)
            if env is None:
                env = _Env(trajectory_id, time.monotonic())
                self._envs[trajectory_id] = env
                self._arrivals.append(time.monotonic())
            if env.exceeded:
                raise WorkdirQuotaError(
                    f"trajectory {trajectory_id!r}: its work dir grew past the "
                    f"{self.limits.workdir_mb} MiB quota; end_trajectory() it and start over"
                )
            env.active += 1
            return env

    def _leave(self, env: _Env) -> None:
        with self._lock:
            env.active -= 1
            env.last_used = time.monotonic()

    def _take_container(self, env: _Env) -> None:
        """Give ``env`` a ready container: from the warm pool, else a new one."""
        with self._lock:
            container = self._pool.popleft() if self._pool else None
        self._wake.set()
        if container is None:
            container = self._create()
        with self._lock:
            ended = env.ended
            if not ended:
                env.container, env.used, env.broken, env.oom_seen = container, False, None, 0
        if ended:
            self._discard(container)
            raise SandboxError(f"trajectory {env.trajectory_id!r} was ended while its action "
                               "was starting")

    def _create(self) -> Any:
        t0 = time.monotonic()
        try:
            container = self.client.containers.run(
                self.image, **container_options(self.limits, self._labels, self._seccomp))
        except API_ERRORS as exc:
            raise SandboxSetupError(f"cannot start a sandbox container from {self.image!r}: "
                                    f"{exc}") from exc
        with self._lock:
            self.create_s = 0.8 * self.create_s + 0.2 * (time.monotonic() - t0)
        return container

    def _discard(self, container: Any) -> None:
        """Remove a container in the background (force: kills what runs in it)."""
        try:
            self._background.submit(self._remove, container)
        except RuntimeError:  # shutting down
            self._remove(container)

    def _remove(self, container: Any) -> None:
        self._remove_id(str(container.id))

    def _remove_id(self, container_id: str) -> None:
        with contextlib.suppress(*API_ERRORS):
            self.client.api.remove_container(container_id, force=True, v=True)

    # -- the pool keeper --------------------------------------------------------------------

    def _keep(self, tick_s: float) -> None:
        """The pool keeper's loop: expire idle trajectories, resize the warm pool."""
        while True:
            self._wake.wait(tick_s)
            self._wake.clear()
            with self._lock:
                if self._closed:
                    return
            try:
                self._expire_idle()
                self._refill()
            except KEEPER_ERRORS:
                log.warning("the docker pool keeper's tick failed", exc_info=True)

    def _expire_idle(self) -> None:
        with self._lock:
            last = {tid: env.last_used for tid, env in self._envs.items()}
            busy = {tid for tid, env in self._envs.items() if env.active or env.lock.locked()}
        for trajectory_id in idle_expired(last, busy, time.monotonic(), self.idle_ttl_s):
            if self._end(trajectory_id, idle_since=last[trajectory_id]):
                log.info("trajectory %s was idle for %.0f s: its container is removed",
                         trajectory_id, self.idle_ttl_s)

    def _refill(self) -> None:
        with self._lock:
            target = warm_pool_target(self._arrivals, time.monotonic(), self.create_s,
                                      self.pool_policy)
            plan = plan_pool(len(self._pool), self._creating, target)
            surplus = [self._pool.pop() for _ in range(plan.remove)]
            self._creating += plan.create
        for container in surplus:
            self._discard(container)
        for _ in range(plan.create):
            self._add_to_pool()

    def _add_to_pool(self) -> None:
        try:
            container = self._create()
        except SandboxError as exc:
            log.warning("cannot add a container to the warm pool: %s", exc)
            container = None
        with self._lock:
            self._creating -= 1
            keep = container is not None and not self._closed
            if keep:
                self._pool.append(container)
        if container is not None and not keep:
            self._remove(container)

    # -- one action -------------------------------------------------------------------------

    def _run_locked(
        self, env: _Env, spec: ExecSpec, files: list[SpecFile], t0: float
    ) -> DockerExecOutcome:
        self._wait_settled(env)
        for attempt in (1, 2):
            if env.container is None or env.broken is not None:
                self._replace(env)
            try:
                outcome = self._attempt(env, spec, files, t0)
            except _Broken as exc:
                self._mark_broken(env, str(exc))
                if env.ended:
                    raise SandboxError(f"trajectory {env.trajectory_id!r} was ended while its "
                                       "action ran") from exc
                if attempt == 2:
                    raise SandboxSetupError(
                        f"the sandbox container failed twice for trajectory "
                        f"{env.trajectory_id!r}: {exc}") from exc
                continue
            lost, env.lost = env.lost, None
            return replace(outcome, environment_replaced=lost is not None,
                           replaced_reason=lost or "")
        raise AssertionError("unreachable")

    def _replace(self, env: _Env) -> None:
        old = env.container
        if old is not None:
            if env.used:
                env.lost = env.lost or env.broken or "the container broke"
            env.container = None
            self._discard(old)
        self._take_container(env)

    @staticmethod
    def _mark_broken(env: _Env, reason: str) -> None:
        log.warning("the container of trajectory %s is broken and will be replaced: %s",
                    env.trajectory_id, reason)
        env.broken = reason

    def _wait_settled(self, env: _Env) -> None:
        if env.settle is not None:
            with contextlib.suppress(TimeoutError, CancelledError):
                env.settle.result(timeout=30)
            env.settle = None

    @staticmethod
    def _pin(container: Any, cores: tuple[int, ...]) -> None:
        try:
            container.update(**cpu_options(cores))
        except docker.errors.APIError as exc:
            if "not available" in str(exc):
                raise SandboxSpecError("cores", f"{exc}; allocate cores the engine has") from exc
            raise _Broken(f"cannot pin the container to cores {list(cores)}: {exc}") from exc
        except API_ERRORS as exc:
            raise _Broken(f"cannot pin the container: {exc}") from exc

    def _settle(self, env: _Env, container: Any) -> None:
        """After an action: hand the cores back by throttling the container to 1% of a core."""
        try:
            container.update(**idle_cpu_options())
        except API_ERRORS as exc:
            with self._lock:
                if env.container is container and env.broken is None:
                    self._mark_broken(env, f"cannot throttle the container after an action: {exc}")

    def _attempt(
        self, env: _Env, spec: ExecSpec, files: list[SpecFile], t0: float
    ) -> DockerExecOutcome:
        container = env.container
        self._pin(container, spec.cores)
        command = rewrite_parallelism(spec.command, max(units_of(spec), 1))
        payload = self._stdin_payload(spec, files)
        run = _Run(*self._sinks(), t_start=time.monotonic(), started_at=time.time())
        try:
            exec_id, finished = self._exec(container, spec, command, files, payload, run)
        finally:
            env.settle = self._background.submit(self._settle, env, container)
        return self._conclude(env, spec, run, exec_id, finished, t0)

    def _sinks(self) -> tuple[CappedBuffer, CappedBuffer, TrailerSink, ReadyMarker, CappedBuffer]:
        cap = self.limits.output_cap_bytes
        stdout, stderr = CappedBuffer(cap), CappedBuffer(cap)
        trailer = TrailerSink(stderr)
        return stdout, stderr, trailer, ReadyMarker(READY_MARKER, trailer), CappedBuffer(4096)

    @staticmethod
    def _stdin_payload(spec: ExecSpec, files: list[SpecFile]) -> bytes | None:
        data = encode_files(files) if files else b""
        if spec.stdin is not None:
            data += spec.stdin.encode("utf-8", "surrogateescape")
        return data if (files or spec.stdin is not None) else None

    def _exec(
        self, container: Any, spec: ExecSpec, command: str, files: list[SpecFile],
        payload: bytes | None, run: _Run,
    ) -> tuple[str, bool]:
        """Start the wrapper and pump its socket; (exec id, finished before the deadline)."""
        env_vars = sandbox_env(spec, BASE_ENV)
        argv = wrapper_argv(spec.timeout_s, command, bool(files))
        try:
            exec_id = self.client.api.exec_create(
                container.id, argv, stdout=True, stderr=True, stdin=payload is not None,
                tty=False, environment=env_vars, workdir=INSIDE_WORKDIR,
                user=f"{SANDBOX_UID}:{SANDBOX_UID}")["Id"]
            handle = self.client.api.exec_start(exec_id, socket=True)
        except API_ERRORS as exc:
            raise _Broken(f"cannot exec in the container: {exc}") from exc
        sock = _raw_socket(handle)
        try:
            sock.setblocking(False)
            first = _read_ahead(handle)
            setup_deadline = run.t_start + self.setup_timeout_s

            def deadline() -> float:
                ready = run.marker.ready_at
                return setup_deadline if ready is None else ready + spec.timeout_s + self.grace_s

            exchange = _Exchange(sock, FrameDemuxer(), {1: run.stdout, 2: run.marker,
                                                        3: run.engine_err}, payload, deadline)
            finished = pump_socket(exchange, first)
        finally:
            with contextlib.suppress(OSError):
                sock.close()
            with contextlib.suppress(OSError, AttributeError):
                handle.close()
        return exec_id, finished

    def _exit_code(self, exec_id: str) -> int | None:
        deadline = time.monotonic() + 2.0
        while True:
            try:
                info = self.client.api.exec_inspect(exec_id)
            except API_ERRORS:
                return None
            if not info.get("Running") or time.monotonic() > deadline:
                code = info.get("ExitCode")
                return int(code) if isinstance(code, int) else None
            time.sleep(0.005)

    def _conclude(
        self, env: _Env, spec: ExecSpec, run: _Run, exec_id: str, finished: bool, t0: float
    ) -> DockerExecOutcome:
        end, finished_at = time.monotonic(), time.time()
        trailer = run.trailer_sink.finish(end)
        if env.ended:
            raise SandboxError(f"trajectory {env.trajectory_id!r} was ended while its action ran")
        if not finished:
            self._mark_broken(env, f"the exec did not end within timeout_s + {self.grace_s} s")
            return self._outcome(run, None, t0, end, finished_at, timed_out=True)
        code = self._exit_code(exec_id)
        if run.marker.ready_at is None:
            raise self._startup_error(env, run, code)
        env.used = True
        if trailer is None:
            oom = self._reset(env)
            return self._outcome(run, None, t0, end, finished_at, code=code, oom=oom,
                                 timed_out=end - run.marker.ready_at >= spec.timeout_s)
        env.oom_seen = trailer.oom_after
        timed_out = trailer.exit_code == 137 and trailer.elapsed_s >= spec.timeout_s - 0.011
        return self._outcome(run, trailer, t0, end, finished_at, code=trailer.exit_code,
                             timed_out=timed_out, env=env)

    def _startup_error(self, env: _Env, run: _Run, code: int | None) -> SandboxError:
        preamble = bytes(run.marker.preamble)
        reported = preamble_error(preamble)
        if reported is not None:
            return reported
        detail = (preamble + bytes(run.engine_err.data) + bytes(run.stderr.data))
        text = detail.decode("utf-8", "replace").strip() or diagnose(env.container)
        return _Broken(f"the sandbox wrapper did not start (exit {code}): {text}")

    def _reset(self, env: _Env) -> bool:
        """After an action whose wrapper died: kill what is left, read the OOM counter.

        Returns whether an OOM kill happened; marks the container broken if this fails.
        """
        script = ("kill -9 -1 2>/dev/null; o=0; for f in /sys/fs/cgroup/memory/memory.oom_control "
                  "/sys/fs/cgroup/memory.events; do [ -r $f ] || continue; while read -r k v; "
                  "do [ $k = oom_kill ] && o=$v; done < $f; break; done; echo $o")
        container = env.container
        if container is None:
            return False
        try:
            result = container.exec_run(["/bin/sh", "-c", script],
                                            user=f"{SANDBOX_UID}:{SANDBOX_UID}")
            count = int(result.output.decode().strip().splitlines()[-1])
        except RESET_ERRORS as exc:
            self._mark_broken(env, f"cannot reset the container after an action: {exc}")
            return False
        oom, env.oom_seen = count > env.oom_seen, count
        return oom

    def _outcome(
        self,
        run: _Run,
        trailer: Trailer | None,
        t0: float,
        end: float,
        finished_at: float,
        *,
        timed_out: bool,
        code: int | None = None,
        oom: bool = False,
        env: _Env | None = None,
    ) -> DockerExecOutcome:
        ready = command_start(t0, run.marker.ready_at, end, trailer)
        exit_code, sig = exit_status(code, timed_out=timed_out)
        usage = trailer.workdir_bytes if trailer is not None else None
        exceeded = usage is not None and usage > self.limits.workdir_mb * MB
        if exceeded and env is not None:
            with self._lock:
                env.exceeded = True
        return DockerExecOutcome(
            exit_code=exit_code, signal=sig, timed_out=timed_out,
            oom_killed=trailer.oom_killed if trailer is not None else oom,
            stdout=run.stdout.text(), stderr=run.stderr.text(),
            stdout_truncated=run.stdout.truncated, stderr_truncated=run.stderr.truncated,
            started_at=run.started_at, finished_at=finished_at,
            setup_s=max(ready - t0, 0.0), exec_s=max(end - ready, 0.0),
            workdir_bytes=usage or 0, workdir_exceeded=exceeded,
        )
