"""The basic manager's decision on plain data: may a ticket take its needs now, when to ask again.

:class:`~tangram_celery.managers.basic.store.QuotaStore`'s Lua script implements :func:`decide`
atomically.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tangram_celery.managers.basic.limits import ApiSpec, Need, Quota

# Decision reasons, also returned by the Lua script.
GRANTED = ""
ORDER = "order"
TOKENS = "tokens"
LEASES = "leases"
LOST = "lost"


def refill(tokens: float | None, refilled_at: float, now: float, quota: Quota) -> float:
    """Token level of a bucket at ``now`` (``tokens=None``: a bucket never used, so full)."""
    if tokens is None:
        return float(quota.capacity)
    elapsed = max(now - refilled_at, 0.0)
    return min(float(quota.capacity), tokens + elapsed * quota.rate_per_s)


@dataclass(frozen=True)
class ApiState:
    """The Redis state of one API as plain data (what :func:`decide` reads)."""

    tokens: float | None = None
    refilled_at: float = 0.0
    leases: tuple[float, ...] = ()
    tickets: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Decision:
    """Whether a ticket may start now; if not, why (first blocker) and a lower bound on the wait
    for tokens in seconds."""

    granted: bool
    reason: str = GRANTED
    api: str = ""
    wait_s: float = 0.0


def decide(
    ticket: str,
    needs: Sequence[Need],
    specs: Mapping[str, ApiSpec],
    states: Mapping[str, ApiState],
    now: float,
) -> Decision:
    """May ``ticket`` take ``needs`` now? The same rule as the Lua script, on plain data.

    For each API in order: expired tickets and leases are ignored; a ticket that is gone is
    ``lost``; otherwise the ticket must be the first live one (``order``), the bucket must hold
    the amount (``tokens``, with the time until it will) and the live leases plus the amount must
    fit the cap (``leases``). Granted only when no API blocks.
    """
    blocker: tuple[str, str] | None = None
    wait = 0.0
    for need in needs:
        spec, state = specs[need.api], states.get(need.api, ApiState())
        live = [t for t, deadline in state.tickets if deadline > now]
        if ticket not in live:
            return Decision(False, LOST, need.api)
        if live[0] != ticket:
            blocker = blocker or (ORDER, need.api)
        if spec.quota is not None:
            level = refill(state.tokens, state.refilled_at, now, spec.quota)
            if level < need.amount:
                wait = max(wait, (need.amount - level) / spec.quota.rate_per_s)
                blocker = blocker or (TOKENS, need.api)
        if spec.concurrency is not None:
            held = sum(1 for expiry in state.leases if expiry > now)
            if held + need.amount > spec.concurrency:
                blocker = blocker or (LEASES, need.api)
    if blocker is not None:
        return Decision(False, blocker[0], blocker[1], wait)
    return Decision(True)


def pause_for(decision: Decision, poll_s: float, max_pause_s: float) -> float:
    """How long the gate waits before asking again after a refusal.

    Tokens refill on a known schedule, so a ``tokens`` refusal sleeps exactly until they are
    back; ``order`` and ``leases`` depend on other workers, so they poll (never sooner than the
    token wait); ``lost`` retries at once after re-registering.
    """
    if decision.granted or decision.reason == LOST:
        return 0.0
    pause = decision.wait_s if decision.reason == TOKENS else max(decision.wait_s, poll_s)
    return min(max(pause, 0.0005), max_pause_s)
