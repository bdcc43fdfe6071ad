"""The node's side of one malleable action in a sandbox: its cores and its workers change
together, the cpuset first both when it grows and when it shrinks."""

from __future__ import annotations

from typing import Any

from tangram_celery.sandbox.base import RunControl, SandboxBackend


class CoreResizer:
    """Grows and shrinks the malleable run of ``trajectory_id``'s running action, pinned to
    ``cores``, which ``control`` reaches (its control socket in the work dir)."""

    def __init__(self, backend: SandboxBackend, trajectory_id: str, cores: tuple[int, ...],
                 control: RunControl, timeout_s: float = 10.0) -> None:
        self.backend = backend
        self.trajectory_id = trajectory_id
        self.cores = tuple(cores)
        self.control = control
        self.timeout_s = timeout_s

    def ask(self, operation: str) -> dict[str, Any]:
        """The run's answer to ``operation`` (empty when it did not answer)."""
        try:
            return self.control(operation, self.timeout_s)
        except (OSError, ValueError):
            return {}

    def grow(self, core: int) -> bool:
        """Add ``core`` to the action's cpuset, then a worker to the run; False, changing
        nothing, when either refuses."""
        wider = (*self.cores, core)
        if not self._repin(wider):
            return False
        if not self.ask("grow").get("ok"):
            self._repin(self.cores[:-1])
            return False
        return True

    def take(self) -> int | None:
        """Take the action's last core back at once, by narrowing its cpuset (the run's
        workers keep running on the cores left); the core, or None when the cpuset keeps all
        it has. Then :meth:`retire` a worker."""
        if len(self.cores) < 2:
            return None
        released = self.cores[-1]
        return released if self._repin(self.cores[:-1]) else None

    def retire(self) -> bool:
        """Ask the run to retire one worker after its current test (a worker not yet working
        is stopped at once); whether it agreed."""
        return bool(self.ask("shrink").get("ok"))

    def _repin(self, cores: tuple[int, ...]) -> bool:
        if not self.backend.repin(self.trajectory_id, self.cores, cores):
            return False
        self.cores = cores
        return True
