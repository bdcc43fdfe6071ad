"""The sandbox container's options: isolation, limits, mounts, seccomp profile and cpu pinning.

Pure: :func:`container_options` gives ``containers.run`` its arguments, :func:`cpu_options` and
:func:`idle_cpu_options` those of ``container.update`` during and between actions.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping, Sequence
from typing import Any

import docker.types

from tangram_celery.errors import SandboxSetupError
from tangram_celery.sandbox.base import BASE_ENV, INSIDE_WORKDIR, MB, SandboxLimits
from tangram_celery.sandbox.cgroups import format_cpus
from tangram_celery.sandbox.seccomp import _NAMES as EMBEDDED_DENY_LIST

INIT_UID = 0  # docker-init and the resident executor: root with SETUID, SETGID, SETPCAP only
CPU_PERIOD_US = 100_000
IDLE_CPU_QUOTA_US = 1_000
PIDS_OVERHEAD = 4  # docker-init, its sleep, the resident executor and its leftover killer
WORKDIR_SLACK = MB  # the tmpfs is this much larger than the quota, so "over quota" is visible


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
    limits: SandboxLimits, labels: Mapping[str, str], seccomp: str | None, uid: int
) -> dict[str, Any]:
    """Keyword arguments of ``containers.run`` for one sandbox container (minus the image) whose
    actions run as host ``uid``: its ``/work`` belongs to that uid alone."""
    tmp = f"rw,exec,nosuid,nodev,size={limits.tmp_mb}m,mode=1777"
    work_size = limits.workdir_mb * MB + WORKDIR_SLACK
    work = f"rw,exec,nosuid,nodev,size={work_size},mode=0700,uid={uid},gid={uid}"
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
        "cap_add": ["SETUID", "SETGID", "SETPCAP"],
        "security_opt": security,
        "ulimits": ulimits,
        "cpu_period": CPU_PERIOD_US,
        "cpu_quota": CPU_PERIOD_US,
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
