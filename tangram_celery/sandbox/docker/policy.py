"""The docker backend's pool policy: the warm pool's size and when idle trajectories expire.

Pure functions of arrival times, pool counts and idle times; the pool keeper applies them.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from tangram_celery.errors import SandboxSpecError


@dataclass(frozen=True)
class WarmPoolPolicy:
    """How many ready containers to keep: between ``min_size`` and ``max_size``.

    The target covers the trajectory starts expected while one container is being created
    (the mean arrival rate over ``window_s`` times the creation time, times ``headroom``) and
    the largest burst of starts seen within one creation time in that window.
    """

    min_size: int = 1
    max_size: int = 8
    window_s: float = 60.0
    headroom: float = 2.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_size <= self.max_size:
            raise SandboxSpecError("warm_pool", "need 0 <= min_size <= max_size")
        if self.window_s <= 0 or self.headroom <= 0:
            raise SandboxSpecError("warm_pool", "window_s and headroom must be positive")


def peak_arrivals(times: Sequence[float], span: float) -> int:
    """The largest number of ``times`` (sorted) inside any interval of length ``span``."""
    best, start = 0, 0
    for end, t in enumerate(times):
        while t - times[start] > span:
            start += 1
        best = max(best, end - start + 1)
    return best


def warm_pool_target(
    arrivals: Iterable[float], now: float, create_s: float, policy: WarmPoolPolicy
) -> int:
    """The warm-pool size for trajectory-start times ``arrivals`` seen up to ``now``."""
    recent = sorted(t for t in arrivals if now - policy.window_s < t <= now)
    if not recent:
        return policy.min_size
    steady = math.ceil(len(recent) / policy.window_s * max(create_s, 0.0) * policy.headroom)
    burst = peak_arrivals(recent, max(create_s, 0.0))
    return max(policy.min_size, min(policy.max_size, max(steady, burst)))


@dataclass(frozen=True)
class PoolPlan:
    """What the pool keeper does next: create or remove this many ready containers."""

    create: int = 0
    remove: int = 0


def plan_pool(ready: int, creating: int, target: int) -> PoolPlan:
    """Reach ``target`` ready containers, counting those being created already."""
    if ready + creating < target:
        return PoolPlan(create=target - ready - creating)
    if ready > target:
        return PoolPlan(remove=ready - target)
    return PoolPlan()


def idle_expired(
    last_used: Mapping[str, float], busy: Collection[str], now: float, ttl_s: float
) -> list[str]:
    """Trajectories idle for at least ``ttl_s`` and not running an action, oldest first."""
    expired = [(t, tid) for tid, t in last_used.items() if tid not in busy and now - t >= ttl_s]
    return [tid for _, tid in sorted(expired)]
