"""Work-dir files and usage: a trajectory's dir name, safe writes of spec files, disk usage.

Spec files are written without ever following a symlink the sandbox may have planted; the usage
walk never follows one either.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from tangram_celery.errors import SandboxSpecError
from tangram_celery.sandbox.validation import SpecFile, validate_trajectory_id


def workdir_name(trajectory_id: str) -> str:
    """A file-system-safe, collision-resistant directory name for a trajectory id."""
    digest = hashlib.sha256(validate_trajectory_id(trajectory_id).encode()).hexdigest()
    return f"t-{digest[:40]}"


def _open_dir_at(parent_fd: int, name: str, uid: int, gid: int, where: str) -> int:
    """Open (creating if needed) a sub-directory without following symlinks."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, dir_fd=parent_fd)
    except FileNotFoundError:
        pass
    except (NotADirectoryError, OSError) as exc:
        raise SandboxSpecError(where, f"{name!r} exists in the work dir and is not a directory "
                               f"({exc.strerror}); pick another path") from exc
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o755, dir_fd=parent_fd)
    fd = os.open(name, flags, dir_fd=parent_fd)
    os.fchown(fd, uid, gid)
    return fd


def _write_file_at(dir_fd: int, name: str, data: bytes, uid: int, gid: int, where: str) -> None:
    """Replace ``name`` in ``dir_fd`` with a fresh regular file holding ``data``.

    Whatever was there (a symlink planted by the sandbox, a hard link, a FIFO) is unlinked first,
    so the write can never land outside the work dir.
    """
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise SandboxSpecError(where, f"{name!r} is a directory in the work dir; "
                                   "pick another path")
        os.unlink(name, dir_fd=dir_fd)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, 0o644, dir_fd=dir_fd)
    try:
        os.fchown(fd, uid, gid)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
    finally:
        os.close(fd)


def write_files(workdir: Path, files: list[SpecFile], uid: int, gid: int) -> None:
    """Write validated spec files into ``workdir``, owned by ``uid:gid``, never via symlinks."""
    root_fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for spec_file in files:
            where = f"files[{spec_file.name!r}]"
            fds: list[int] = []
            try:
                dir_fd = root_fd
                for part in spec_file.parts[:-1]:
                    dir_fd = _open_dir_at(dir_fd, part, uid, gid, where)
                    fds.append(dir_fd)
                _write_file_at(dir_fd, spec_file.parts[-1], spec_file.data, uid, gid, where)
            finally:
                for fd in fds:
                    os.close(fd)
    finally:
        os.close(root_fd)


def _walk_sizes(path: str) -> Iterator[int]:
    """Yield the allocated bytes of every entry below ``path``, never following symlinks."""
    try:
        entries = list(os.scandir(path))
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        yield max(st.st_blocks * 512, 512)
        if stat.S_ISDIR(st.st_mode):
            yield from _walk_sizes(entry.path)


def dir_usage(path: Path, stop_above: int | None = None) -> int:
    """Disk usage of a directory tree in bytes (each entry counts at least 512 bytes).

    Stops counting once the total passes ``stop_above``, so a huge tree costs little to reject.
    """
    total = 0
    for size in _walk_sizes(str(path)):
        total += size
        if stop_above is not None and total > stop_above:
            break
    return total
