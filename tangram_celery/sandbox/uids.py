"""Sandbox uids of both backends: the host-wide uid pool, its range check, killing a uid.

Each live trajectory runs as its own host uid (a bwrap sandbox, or a docker container's
actions), so RLIMIT_NPROC and file ownership never mix trajectories, one trajectory cannot
signal or read another's processes even from outside its sandbox, and every process of a
trajectory's uid can be killed when it ends. Both backends take their uids from one pool per
host (the lock files of :data:`LOCK_DIR`), so they never hand out the same uid.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import signal
import stat
import tempfile
import time
from pathlib import Path

from tangram_celery.errors import SandboxCapacityError, SandboxSetupError

LOCK_DIR = Path("/run/tangram-sandbox-uids")
"""Where a held uid's lock file lives (one directory per host, shared by every backend)."""


def default_lock_dir() -> Path:
    """:data:`LOCK_DIR` for root; for another user (a docker node in the ``docker`` group) a
    directory of its own under the temp dir, checked to be its own by :class:`UidPool`."""
    euid = os.geteuid()
    return LOCK_DIR if euid == 0 else Path(tempfile.gettempdir()) / f"tangram-sandbox-uids-{euid}"


def _proc_uid(pid_dir: str) -> int | None:
    try:
        with open(f"/proc/{pid_dir}/status") as fh:
            for line in fh:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _check_uid_range(uid_base: int, uid_count: int) -> None:
    """The sandbox uid range must be unused: its processes are killed when trajectories end."""
    if uid_base < 1 or uid_count < 1 or uid_base + uid_count > 2**31:
        raise SandboxSetupError("uid_base/uid_count must describe non-root uids below 2**31")
    taken = sorted(
        f"{entry.pw_name}={entry.pw_uid}" for entry in pwd.getpwall()
        if uid_base <= entry.pw_uid < uid_base + uid_count
    )
    if taken:
        raise SandboxSetupError(
            f"sandbox uids {uid_base}..{uid_base + uid_count - 1} include host accounts "
            f"({', '.join(taken[:5])}); every process of a trajectory's uid is killed when it "
            "ends, so pick a range no account uses (default uid_base=1500000)"
        )


def kill_uid(uid: int, passes: int = 5) -> int:
    """SIGKILL every host process whose real uid is ``uid``; returns how many were signalled."""
    killed = 0
    for _ in range(passes):
        victims = [int(p) for p in os.listdir("/proc") if p.isdigit() and _proc_uid(p) == uid]
        if not victims:
            break
        for pid in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        time.sleep(0.01)
    return killed


class UidPool:
    """Sandbox uids for live trajectories, exclusive across every backend on this host.

    A uid is taken by holding an ``flock`` on ``<lock_dir>/<uid>``, so two workers whose ranges
    overlap never hand out the same uid (which would let one kill the other's processes when a
    trajectory ends). Freed uids are reused first. Not thread-safe: the backend holds its lock.
    """

    def __init__(self, base: int, count: int, lock_dir: Path) -> None:
        _check_uid_range(base, count)
        self.base, self.count = base, count
        self.lock_dir = lock_dir
        self._free: list[int] = []
        self._elsewhere: list[int] = []
        self._next = base
        self._locks: dict[int, int] = {}

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, int) and self.base <= uid < self.base + self.count

    def take(self) -> int:
        """A uid no other live trajectory on this host holds."""
        while self._free:
            uid = self._free.pop()
            if self._lock(uid):
                return uid
            self._elsewhere.append(uid)
        while self._next < self.base + self.count:
            uid, self._next = self._next, self._next + 1
            if self._lock(uid):
                return uid
            self._elsewhere.append(uid)
        for uid in list(self._elsewhere):  # held by another worker earlier: free by now?
            if self._lock(uid):
                self._elsewhere.remove(uid)
                return uid
        raise SandboxCapacityError(
            f"all {self.count} sandbox uids from {self.base} are held by live trajectories; "
            "end finished trajectories or raise uid_count"
        )

    def give_back(self, uid: int) -> None:
        """Release a uid taken with :meth:`take`."""
        fd = self._locks.pop(uid, None)
        if fd is not None:
            os.close(fd)
            self._free.append(uid)

    def _lock(self, uid: int) -> bool:
        try:
            self.lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            held = os.lstat(self.lock_dir)
            if not stat.S_ISDIR(held.st_mode) or held.st_uid != os.geteuid():
                raise SandboxSetupError(
                    f"the uid lock dir {self.lock_dir} is not a directory of this user's "
                    f"(uid {os.geteuid()}); remove it or choose another uid_lock_dir")
            fd = os.open(self.lock_dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise SandboxSetupError(
                f"cannot use the uid lock dir {self.lock_dir}: {exc.strerror}"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._locks[uid] = fd
        return True
