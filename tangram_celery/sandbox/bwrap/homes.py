"""Each sandbox's home on the host: a directory holding ``work``, the sandbox's ``/work``.

Where the node may mount (as root, with ``CAP_SYS_ADMIN`` in its mount namespace), ``work`` is a
tmpfs of the work-dir quota's size, owned by the sandbox's uid: a write past the quota fails
inside the sandbox with ``ENOSPC`` while the action runs, however many files it spreads over,
and nothing reaches the node's disk. Its pages are memory, charged by the kernel to the cgroup
of the process that writes them, so the backend adds the quota to the sandbox's memory limit
(as the docker backend does for its ``/work`` tmpfs). Elsewhere ``work`` is a plain directory
and the quota is checked after each action.

The home, not ``work``, is what is renamed (a ready sandbox taken by a trajectory, an ended one
set aside): a mount point cannot be renamed, its parent can.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
from pathlib import Path

from tangram_celery.sandbox.base import MB

WORK = "work"
MS_NOSUID, MS_NODEV = 0x2, 0x4
MNT_DETACH = 0x2
INODES_PER_MB = 256


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def mount_tmpfs(target: Path, size_bytes: int, uid: int, inodes: int) -> None:
    """Mount a tmpfs of ``size_bytes`` (``inodes`` files at most) at ``target``, mode 0700 and
    owned by ``uid``; raises OSError."""
    options = f"size={size_bytes},nr_inodes={inodes},mode=0700,uid={uid},gid={uid}"
    if _libc().mount(b"tmpfs", os.fsencode(target), b"tmpfs", MS_NOSUID | MS_NODEV,
                     options.encode()) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount tmpfs on {target}: {os.strerror(code)}")


def unmount(target: Path) -> None:
    """Detach the mount at ``target`` (nothing when none is there)."""
    if _libc().umount2(os.fsencode(target), MNT_DETACH) != 0:
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOENT):
            raise OSError(code, f"umount {target}: {os.strerror(code)}")


def _unescape(field: str) -> str:
    """A mountinfo path field with its octal escapes (``\\040`` for a space) decoded."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts_below(path: Path, mountinfo: str) -> list[Path]:
    """The mount points strictly below ``path`` in ``mountinfo``'s text, deepest first."""
    prefix = str(path).rstrip("/") + "/"
    found = [Path(_unescape(line.split()[4])) for line in mountinfo.splitlines()
             if len(line.split()) > 4 and _unescape(line.split()[4]).startswith(prefix)]
    return sorted(set(found), key=lambda p: len(p.parts), reverse=True)


def unmount_below(path: Path) -> None:
    """Detach every mount below ``path`` (a dead worker's sandboxes), so it can be removed."""
    with contextlib.suppress(OSError):
        for target in mounts_below(path, Path("/proc/self/mountinfo").read_text()):
            with contextlib.suppress(OSError):
                unmount(target)


class Homes:
    """Makes and removes sandbox homes in one instance dir (see the module docstring).

    ``tmpfs`` asks for a tmpfs ``work``; :attr:`tmpfs` says whether the node can mount one (a
    probe mount at start), and :attr:`reason` why not.
    """

    def __init__(self, instance_dir: Path, quota_mb: int, tmpfs: bool) -> None:
        self.instance_dir = instance_dir
        self.quota_bytes = quota_mb * MB
        self.inodes = max(4096, quota_mb * INODES_PER_MB)
        self.reason = ""
        self.tmpfs = tmpfs and self._probe()

    def _probe(self) -> bool:
        probe = self.instance_dir / ".mount-probe"
        try:
            probe.mkdir()
            mount_tmpfs(probe, MB, os.getuid(), 16)
            unmount(probe)
        except OSError as exc:
            self.reason = f"work dir: cannot mount a tmpfs per sandbox ({exc.strerror or exc}); " \
                          "run the node as root with CAP_SYS_ADMIN"
            return False
        finally:
            with contextlib.suppress(OSError):
                probe.rmdir()
        return True

    def make(self, home: Path, uid: int) -> None:
        """Create ``home`` and its ``work`` for ``uid`` (a tmpfs when :attr:`tmpfs`); raises
        OSError, leaving nothing behind."""
        home.mkdir(mode=0o700)
        try:
            os.chown(home, uid, uid)
            work = home / WORK
            work.mkdir(mode=0o700)
            os.chown(work, uid, uid)
            if self.tmpfs:
                mount_tmpfs(work, self.quota_bytes, uid, self.inodes)
        except OSError:
            self.remove(home)
            raise

    def remove(self, home: Path) -> None:
        """Unmount ``home``'s work dir and delete it all (nothing when it is gone)."""
        with contextlib.suppress(OSError):
            unmount(home / WORK)
        shutil.rmtree(home, ignore_errors=True)
