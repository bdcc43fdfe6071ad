"""Test hosts made of real kernel namespaces, for the multi-host tests.

Each :class:`Host` is a network namespace of its own (``ip netns add``) with one veth link into a
switch: a bridge that lives in a namespace of its own, so the root namespace (where pytest runs)
has no address in the hosts' subnet and no traffic between hosts can go over its loopback. A
host's processes run under ``nsenter --net`` and ``unshare --mount``: a private mount namespace in
which a fresh tmpfs covers the sandbox directory, so each host has its own filesystem root for
sandboxes and none can see another's (or leave anything in the root namespace's directory).

:func:`on_host` moves the calling thread into a host's network namespace (``setns(2)``), so the
test itself can be the training script on a host; threads it starts there stay there.

Needs root, a kernel that allows network namespaces, iproute2 (``ip``) and util-linux
(``unshare``); see :func:`require_namespaces`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tangram_celery.processes import spawn_process

SUBNET = "10.77.0"
"""The hosts' /24: a private range that neither this machine nor Docker's defaults use."""

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")
"""Where ``ip netns add`` pins each namespace."""
PRIVATE_FS = 'mount -t tmpfs -o mode=0755,size=512m tangram-host "$0" && exec "$@"'


def require_namespaces() -> None:
    """Skip unless this process may create network namespaces (root, and a kernel that lets
    it); fail when the tools are missing (``scripts/run.sh setup`` installs them)."""
    if os.geteuid() != 0:
        pytest.skip("creating network namespaces needs root")
    missing = [tool for tool in ("ip", "unshare", "nsenter") if not shutil.which(tool)]
    if missing:
        pytest.fail(f"{', '.join(missing)} not found: install iproute2 and util-linux "
                    "(scripts/run.sh setup does)", pytrace=False)


def ip(*args: str) -> str:
    """Run one ``ip`` command; its stdout (raises with its stderr on failure)."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


@dataclass(frozen=True)
class Host:
    """One test host: a network namespace, its address, its link into the switch, and the
    directory that its processes see as a private tmpfs."""

    name: str
    netns: str
    address: str
    port: str
    """Its link's end in the switch namespace (cut it to take the host off the network)."""
    switch: str
    private_dir: Path

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run on this host: in its network namespace and a private mount namespace
        with a fresh tmpfs over :attr:`private_dir`. The namespace is entered with ``nsenter``,
        not ``ip netns exec``, which mounts a fresh sysfs and so hides the cgroup hierarchies:
        a CPU node there could enforce nothing (and, strict, refuses to start)."""
        return ["nsenter", f"--net={NETNS_DIR / self.netns}", "unshare", "--mount",
                "--propagation", "private", "sh", "-c", PRIVATE_FS, str(self.private_dir), *argv]

    def spawn(self, argv: Sequence[str], env: Mapping[str, str],
              log_path: Path | None = None) -> subprocess.Popen[bytes]:
        """Start ``argv`` on this host (see :meth:`argv`)."""
        return spawn_process(self.argv(argv), env, log_path)

    def run(self, argv: Sequence[str], env: Mapping[str, str] | None = None,
            timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on this host to its end."""
        return subprocess.run(self.argv(argv), env={**os.environ, **(env or {})},
                              capture_output=True, text=True, timeout=timeout, check=False)

    def cut(self) -> None:
        """Take the host's link down at the switch: its packets go nowhere, as when a cable
        or a top-of-rack port fails (its connections hang rather than being reset)."""
        ip("-n", self.switch, "link", "set", self.port, "down")

    def restore(self) -> None:
        """Bring the host's link back up."""
        ip("-n", self.switch, "link", "set", self.port, "up")


class Network:
    """A switch namespace and hosts attached to it; removed (with every link) on :meth:`close`."""

    def __init__(self, private_dir: Path) -> None:
        self.tag = f"tgmh{uuid.uuid4().hex[:6]}"
        self.switch = f"{self.tag}-sw"
        self.private_dir = private_dir
        self.hosts: dict[str, Host] = {}
        try:
            ip("netns", "add", self.switch)
        except RuntimeError as exc:
            pytest.skip(f"this machine's kernel does not let us create network namespaces: {exc}")
        ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", self.switch, "link", "set", "br0", "up")

    def add(self, name: str) -> Host:
        """A new host ``name`` with the next address of :data:`SUBNET`."""
        host = Host(name, f"{self.tag}-{name}", f"{SUBNET}.{len(self.hosts) + 1}",
                    f"p-{name}", self.switch, self.private_dir)
        ip("netns", "add", host.netns)
        ip("-n", self.switch, "link", "add", host.port, "type", "veth", "peer", "name", "eth0",
           "netns", host.netns)
        ip("-n", self.switch, "link", "set", host.port, "master", "br0", "up")
        ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        ip("-n", host.netns, "link", "set", "eth0", "up")
        ip("-n", host.netns, "link", "set", "lo", "up")
        self.hosts[name] = host
        return host

    def close(self) -> None:
        """Delete every namespace this network made (their links go with them)."""
        for host in self.hosts.values():
            with contextlib.suppress(RuntimeError):
                ip("netns", "del", host.netns)
        with contextlib.suppress(RuntimeError):
            ip("netns", "del", self.switch)


@contextlib.contextmanager
def network(names: Sequence[str], private_dir: Path) -> Iterator[dict[str, Host]]:
    """Hosts ``names`` on one switch, each with a private tmpfs over ``private_dir``."""
    require_namespaces()
    private_dir.mkdir(parents=True, exist_ok=True)
    net = Network(private_dir)
    try:
        yield {name: net.add(name) for name in names}
    finally:
        net.close()
        with contextlib.suppress(OSError):
            private_dir.rmdir()


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns(CLONE_NEWNET) failed")


@contextlib.contextmanager
def on_host(host: Host) -> Iterator[None]:
    """Run the calling thread in ``host``'s network namespace for the block (threads started in
    the block stay there), then move it back."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{host.netns}", os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(target)
        os.close(own)
