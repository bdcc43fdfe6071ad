"""The actuator interface: what the autoscaler's controller calls on a pool every tick."""

from __future__ import annotations

from typing import Protocol

CPU_POOL = "cpu"


class Actuator(Protocol):
    """Something that can report and change pool sizes (in members)."""

    def sizes(self) -> dict[str, int]:
        """Members per pool that take new work now (draining members excluded)."""

    def scale(self, pool: str, target: int) -> None:
        """Start moving ``pool`` to ``target`` members (may return before it is done)."""

    def step(self) -> None:
        """Move pending work along (finish drains); called once per tick."""

    def close(self) -> None:
        """Stop everything this actuator started."""
