"""A small seccomp-bpf deny-list for sandboxed commands, assembled without libseccomp.

bubblewrap loads it with ``--seccomp FD`` right before it execs the command. It refuses (EPERM)
what a test-running sandbox never needs and what widens the kernel attack surface: the keyring
(``keyctl``, ``add_key``, ``request_key``: the caller's session keyring is otherwise reachable),
io_uring, AF_VSOCK sockets, ``perf_event_open``, ``bpf``, ``userfaultfd``, module and kexec
loading, mount-API and namespace calls, ``ptrace`` and cross-process memory access (no action
can trace the warm executor or another action's processes), the CPU affinity and scheduling
policy calls (``sched_setaffinity``, ``sched_setattr``, and ``sched_setscheduler`` to any policy but
``SCHED_OTHER``, which threads libraries such as libzmq set on each thread they start: an action
cannot widen itself to cores it was not given, even on a host without a cpuset; the node narrows
each action's affinity from outside the sandbox), POSIX message queues (``mq_open``: they would
outlive a request in a recycled sandbox's IPC namespace) and a few more. Syscalls of a
foreign ABI (i386 ``int 0x80``, x32) kill the process. Everything else is
allowed: this complements, not replaces, the namespaces, uid drop, rlimits and cgroups.
"""

from __future__ import annotations

import errno
import platform
import struct

from tangram_celery.errors import SandboxSetupError

# classic BPF opcodes
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_RET_K = 0x06

SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000

_OFF_NR = 0
_OFF_ARCH = 4
_OFF_ARG0_LOW = 16  # args[0], low 32 bits on little-endian machines
_OFF_ARG1_LOW = 24
SCHED_OTHER = 0

AF_VSOCK = 40
X32_SYSCALL_BIT = 0x40000000

_NAMES = (
    "keyctl", "add_key", "request_key",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "perf_event_open", "bpf", "userfaultfd",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "mount", "umount2", "pivot_root", "open_tree", "move_mount", "fsopen", "fsconfig",
    "fsmount", "fspick", "setns", "name_to_handle_at", "open_by_handle_at",
    "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp", "ptrace",
    "syslog", "acct", "quotactl", "swapon", "swapoff", "reboot",
    "sched_setaffinity", "sched_setattr", "mq_open",
)

# (audit arch, syscall numbers by name, socket syscall, deny foreign x32 numbers)
_X86_64 = {
    "keyctl": 250, "add_key": 248, "request_key": 249,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "perf_event_open": 298, "bpf": 321, "userfaultfd": 323,
    "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
    "delete_module": 176, "mount": 165, "umount2": 166, "pivot_root": 155, "open_tree": 428,
    "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "setns": 308, "name_to_handle_at": 303, "open_by_handle_at": 304,
    "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_getfd": 438, "kcmp": 312,
    "ptrace": 101,
    "syslog": 103, "acct": 163, "quotactl": 179, "swapon": 167, "swapoff": 168, "reboot": 169,
    "sched_setaffinity": 203, "sched_setscheduler": 144, "sched_setattr": 314,
    "mq_open": 240, "socket": 41,
}
# asm-generic numbering (aarch64); not exercised by this project's test machines
_AARCH64 = {
    "keyctl": 219, "add_key": 217, "request_key": 218,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "perf_event_open": 241, "bpf": 280, "userfaultfd": 282,
    "kexec_load": 104, "kexec_file_load": 294, "init_module": 105, "finit_module": 273,
    "delete_module": 106, "mount": 40, "umount2": 39, "pivot_root": 41, "open_tree": 428,
    "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "setns": 268, "name_to_handle_at": 264, "open_by_handle_at": 265,
    "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_getfd": 438, "kcmp": 272,
    "ptrace": 117,
    "syslog": 116, "acct": 89, "quotactl": 60, "swapon": 224, "swapoff": 225, "reboot": 142,
    "sched_setaffinity": 122, "sched_setscheduler": 119, "sched_setattr": 274,
    "mq_open": 180, "socket": 198,
}
_ARCHES: dict[str, tuple[int, dict[str, int], bool]] = {
    "x86_64": (0xC000003E, _X86_64, True),
    "aarch64": (0xC00000B7, _AARCH64, False),
}


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def build_filter(machine: str | None = None) -> bytes:
    """The filter program for ``machine`` (default: this host) as raw ``sock_filter`` bytes.

    Raises :class:`SandboxSetupError` on an architecture without a syscall table here; pass
    ``seccomp=False`` to the backend to run there without the filter.
    """
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        raise SandboxSetupError(
            f"no seccomp syscall table for {machine!r} (have {sorted(_ARCHES)}); "
            "start the backend with seccomp=False to run without the filter"
        )
    audit_arch, table, x32 = _ARCHES[machine]
    denied = [table[name] for name in _NAMES]
    deny_errno = SECCOMP_RET_ERRNO | errno.EPERM
    # Layout: arch check, load nr, [x32 check], one JEQ per denied nr, socket check,
    # sched_setscheduler check, ALLOW, socket-arg check, DENY, KILL, policy check.
    body: list[bytes] = []
    n_checks = len(denied) + 2 + (1 if x32 else 0)
    # tail indices, relative to the first instruction after the checks (0 is ALLOW)
    arg_at, deny_at, kill_at, policy_at = 1, 4, 5, 6
    body.append(_insn(_LD_W_ABS, _OFF_ARCH))
    # jump to KILL when the arch differs: skip "ld nr" + checks + tail up to kill
    body.append(_insn(_JEQ_K, audit_arch, 0, 1 + n_checks + kill_at))
    body.append(_insn(_LD_W_ABS, _OFF_NR))
    checks: list[tuple[int, int, int]] = []  # (opcode, k, target-in-tail)
    if x32:
        checks.append((_JGE_K, X32_SYSCALL_BIT, kill_at))
    checks.extend((_JEQ_K, nr, deny_at) for nr in denied)
    checks.append((_JEQ_K, table["socket"], arg_at))
    checks.append((_JEQ_K, table["sched_setscheduler"], policy_at))
    for i, (code, k, target) in enumerate(checks):
        body.append(_insn(code, k, (n_checks - 1 - i) + target, 0))
    body.append(_insn(_RET_K, SECCOMP_RET_ALLOW))               # 0
    body.append(_insn(_LD_W_ABS, _OFF_ARG0_LOW))                # arg_at
    body.append(_insn(_JEQ_K, AF_VSOCK, 1, 0))                  # vsock -> deny
    body.append(_insn(_RET_K, SECCOMP_RET_ALLOW))
    body.append(_insn(_RET_K, deny_errno))                      # deny_at
    body.append(_insn(_RET_K, SECCOMP_RET_KILL_PROCESS))        # kill_at
    body.append(_insn(_LD_W_ABS, _OFF_ARG1_LOW))                # policy_at
    body.append(_insn(_JEQ_K, SCHED_OTHER, 0, 1))               # SCHED_OTHER -> allow
    body.append(_insn(_RET_K, SECCOMP_RET_ALLOW))
    body.append(_insn(_RET_K, deny_errno))
    return b"".join(body)
