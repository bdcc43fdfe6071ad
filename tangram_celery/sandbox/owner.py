"""Owner tags: names that say which process owns a thing, so leftovers of a dead one can go.

Instance dirs, cgroups and containers are named (or labelled) with an :func:`owner_tag`; the next
backend on the host removes those whose process died (:func:`is_stale_tag`).
"""

from __future__ import annotations

import os
import secrets


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def owner_tag(prefix: str) -> str:
    """A unique name for something this process owns: ``<prefix><pidns>-<pid>-<random>``.

    :func:`is_stale_tag` recognises it once its process is gone, so leftovers of a crashed worker
    can be removed by the next one (only within the same pid namespace, where the pid means
    something).
    """
    return f"{prefix}{_pid_namespace()}-{os.getpid()}-{secrets.token_hex(4)}"


def is_stale_tag(name: str, prefix: str) -> bool:
    """Whether ``name`` is an :func:`owner_tag` of a dead process in this pid namespace."""
    if not name.startswith(prefix):
        return False
    fields = name[len(prefix):].split("-")
    if len(fields) != 3 or not fields[0].isdigit() or not fields[1].isdigit():
        return False
    if int(fields[0]) != _pid_namespace() or int(fields[1]) == os.getpid():
        return False
    try:
        os.kill(int(fields[1]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
