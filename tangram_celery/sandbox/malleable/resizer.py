"""The node's side of one malleable action in a sandbox: its cores and its workers change
together, the cpuset first when it grows and at once when it shrinks."""

from __future__ import annotations

from typing import Any

from tangram_celery.sandbox.base import SandboxBackend
from tangram_celery.sandbox.malleable.control import resize


class CoreResizer:
    """Grows and shrinks the malleable run of ``trajectory_id``'s running action, pinned to
    ``cores``, whose control socket is ``control`` (a path on the node, in the work dir)."""

    def __init__(self, backend: SandboxBackend, trajectory_id: str, cores: tuple[int, ...],
                 control: str) -> None:
        self.backend = backend
        self.trajectory_id = trajectory_id
        self.cores = tuple(cores)
        self.control = control

    def grow(self, core: int) -> bool:
        """Add ``core`` to the action's cpuset, then a worker to the run; False, changing
        nothing, when either refuses."""
        wider = (*self.cores, core)
        if not self.backend.repin(self.trajectory_id, self.cores, wider):
            return False
        answer: dict[str, Any] = {}
        try:
            answer = resize(self.control, "grow")
        except OSError:
            answer = {}
        if not answer.get("ok"):
            self.backend.repin(self.trajectory_id, wider, self.cores)
            return False
        self.cores = wider
        return True

    def shrink(self) -> int | None:
        """Retire one worker (after its current test) and take the action's last core back at
        once, from the cpuset; the core given back, or None when the run keeps all it has."""
        try:
            answer = resize(self.control, "shrink")
        except OSError:
            return None
        if not answer.get("ok") or len(self.cores) < 2:
            return None
        narrower = self.cores[:-1]
        if not self.backend.repin(self.trajectory_id, self.cores, narrower):
            return None
        released = self.cores[-1]
        self.cores = narrower
        return released

    def release(self) -> int | None:
        """Take the action's last core back without asking the run, for a core none of its
        workers will take a test on (they drained the queue); the core, or None when the
        cpuset keeps all it has."""
        if len(self.cores) < 2:
            return None
        narrower = self.cores[:-1]
        if not self.backend.repin(self.trajectory_id, self.cores, narrower):
            return None
        released = self.cores[-1]
        self.cores = narrower
        return released
