"""The embedded backend's launch chain: rlimits and bubblewrap's argv around the warm executor.

What a trajectory's sandbox execs once, from the host side into the sandbox::

    prlimit (rlimits) -> bwrap -> python3 -I -c <executor> FD   (the sandbox's pid 1)

bubblewrap's part: new namespaces, read-only system dirs and an ``/etc`` allow-list, private
tmpfs ``/tmp`` and ``/dev/shm``, the work dir at ``/work``, generated ``/etc`` files, a clean
environment and the seccomp filter.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tangram_celery.errors import SandboxSetupError
from tangram_celery.sandbox.base import BASE_ENV, INSIDE_WORKDIR, MB, SandboxLimits
from tangram_celery.sandbox.bwrap.trajectory import Trajectory

INSIDE_UID = 1000
EXECUTOR_PYTHON = "/usr/bin/python3"
SETUP_HELP = "run the README's setup command (it installs bubblewrap and util-linux)"
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
ETC_ALLOWLIST = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "localtime", "timezone",
    "alternatives", "python3", "python3.11", "protocols", "services", "mime.types",
    "os-release", "debian_version", "gai.conf", "host.conf", "ssl/certs", "ssl/openssl.cnf",
    "R", "java-17-openjdk", "php", "ruby", "perl",
)
"""``/etc`` entries the sandbox sees (toolchains' own configuration: R, the JDK, PHP ...)."""
PASSWD = (
    "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
    f"sandbox:x:{INSIDE_UID}:{INSIDE_UID}:tangram sandbox:{INSIDE_WORKDIR}:/bin/sh\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
)
GROUP = f"root:x:0:\nsandbox:x:{INSIDE_UID}:\nnogroup:x:65534:\n"
HOSTS = "127.0.0.1\tlocalhost tangram\n::1\tlocalhost ip6-localhost ip6-loopback\n"
ETC_FILES = {"/etc/passwd": PASSWD, "/etc/group": GROUP, "/etc/hosts": HOSTS}


@functools.cache
def executor_source() -> str:
    """The warm executor's source, handed to the sandbox's python as ``-c`` (no file the
    sandbox could write or swap)."""
    from tangram_celery.sandbox.bwrap import executor

    return Path(executor.__file__).read_text()


def find_tool(name: str, what: str) -> str:
    """The path of tool ``name`` (``what`` names it in the error when it is missing)."""
    path = shutil.which(name)
    if path is None:
        raise SandboxSetupError(f"{what} ({name!r}) not found on PATH; {SETUP_HELP}")
    return path


def _data_fd(content: bytes) -> int:
    """A pipe's read end that yields ``content`` (under 64 KiB) then EOF, for bubblewrap."""
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, content)
    finally:
        os.close(write_fd)
    return read_fd


def system_binds() -> list[str]:
    """Read-only binds (or symlinks, on merged-/usr systems) of the system directories."""
    args: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for name in ETC_ALLOWLIST:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return args


@dataclass(frozen=True)
class LaunchChain:
    """The launch chain's tools and fixed arguments, found once when the backend starts."""

    limits: SandboxLimits
    bwrap: str
    prlimit: str
    system_binds: list[str]
    seccomp: bytes | None
    sh: str = "/bin/sh"

    def rlimit_args(self) -> list[str]:
        """prlimit's options: the per-process limits of ``limits``; the memory ones are soft
        limits at the default below hard ones at the ceiling an action may ask for (each
        action's child sets both to its own, see :func:`action_rlimits`)."""
        lim = self.limits
        top = lim.ceiling_mb
        args = [
            f"--as={lim.effective_address_space_mb * MB}:{lim.address_space_for(top) * MB}",
            f"--data={lim.memory_mb * MB}:{top * MB}",
            f"--nproc={lim.pids}",
            f"--fsize={lim.file_size_mb * MB}",
            f"--nofile={lim.nofile}",
            "--core=0",
        ]
        if lim.cpu_time_s is not None:
            args.append(f"--cpu={lim.cpu_time_s}")
        return args

    def executor_argv(self, traj: Trajectory, channel_fd: int, fds: list[int]) -> list[str]:
        """The chain that starts the trajectory's warm executor (see
        :mod:`~tangram_celery.sandbox.bwrap.executor`) as the sandbox's pid 1, its channel on
        ``channel_fd``; ``fds`` collects the descriptors bubblewrap must inherit."""
        fds.append(channel_fd)
        chain = [self.prlimit, *self.rlimit_args(), "--"]
        sandbox = self.sandbox_args(traj, BASE_ENV, fds, die_with_parent=False)
        return [*chain, *sandbox, "--", EXECUTOR_PYTHON, "-I", "-c", executor_source(),
                str(channel_fd)]

    def sandbox_args(self, traj: Trajectory, env: Mapping[str, str], fds: list[int], *,
                     die_with_parent: bool = True) -> list[str]:
        """bubblewrap and its options, up to the command; ``fds`` collects what it inherits."""

        def fd_of(fd: int) -> str:
            fds.append(fd)
            return str(fd)

        tmp_bytes = str(self.limits.tmp_mb * MB)
        args = [
            self.bwrap,
            "--unshare-all", "--unshare-user", "--disable-userns",
            *(["--die-with-parent"] if die_with_parent else []),
            "--as-pid-1", "--new-session", "--cap-drop", "ALL", "--clearenv",
            "--uid", str(INSIDE_UID), "--gid", str(INSIDE_UID), "--hostname", "tangram",
            *self.system_binds,
            "--proc", "/proc", "--dev", "/dev",
            "--size", tmp_bytes, "--tmpfs", "/tmp",  # nosec B108 # the sandbox's private tmpfs
            "--size", tmp_bytes, "--tmpfs", "/dev/shm",  # nosec B108 # the sandbox's private tmpfs
            "--bind", str(traj.path), INSIDE_WORKDIR,
            "--chdir", INSIDE_WORKDIR,
        ]
        for dest, content in ETC_FILES.items():
            args += ["--perms", "0444", "--ro-bind-data", fd_of(_data_fd(content.encode())), dest]
        for key, value in env.items():
            args += ["--setenv", key, value]
        args += ["--remount-ro", "/dev", "--remount-ro", "/"]
        if self.seccomp is not None:
            args += ["--seccomp", fd_of(_data_fd(self.seccomp))]
        return args


def action_rlimits(limits: SandboxLimits, memory_mb: int | None) -> list[list[int]]:
    """``[resource, soft, hard]`` triples an action's child sets before its code runs: its
    memory (``memory_mb``, else the default) as RLIMIT_DATA and its address space."""
    import resource

    memory = limits.memory_mb if memory_mb is None else memory_mb
    data = memory * MB
    space = limits.address_space_for(memory) * MB
    return [[resource.RLIMIT_DATA, data, data], [resource.RLIMIT_AS, space, space]]
