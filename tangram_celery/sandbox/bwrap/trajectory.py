"""A live trajectory of the embedded backend: its uid, home, running processes and pins."""

from __future__ import annotations

import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tangram_celery.sandbox.bwrap.homes import WORK
from tangram_celery.sandbox.cgroups import ActionCgroup

if TYPE_CHECKING:
    from tangram_celery.sandbox.bwrap.warm import WarmExecutor


@dataclass
class Pin:
    """A running action's cores (as the cpuset holds them now) and its cgroups."""

    cores: tuple[int, ...]
    group: ActionCgroup


@dataclass
class Trajectory:
    """A live trajectory: its uid, work dir, warm executor, its own cgroups and the pins of its
    running actions."""

    trajectory_id: str
    uid: int
    home: Path
    """Its sandbox's home (see :mod:`~tangram_celery.sandbox.bwrap.homes`)."""
    procs: set[subprocess.Popen[bytes]] = field(default_factory=set)
    pins: list[Pin] = field(default_factory=list)
    active: int = 0
    ended: bool = False
    exceeded: bool = False
    released: bool = False
    executor: WarmExecutor | None = None
    start_lock: threading.Lock = field(default_factory=threading.Lock)
    group: ActionCgroup | None = None
    """The trajectory's own cgroups, holding its sandbox; one action at a time runs in them."""
    group_busy: bool = False
    place_lock: threading.Lock = field(default_factory=threading.Lock)
    """Held from the fork of a child to be moved out of the trajectory's groups to its move."""

    @property
    def path(self) -> Path:
        """The work dir on the host: the sandbox's ``/work``."""
        return self.home / WORK
