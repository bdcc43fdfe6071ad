"""The basic manager: API concurrency caps and quotas, enforced across all workers and hosts.

An *API* is a basic resource: it cannot scale, it has a concurrency cap, a quota per period, or
both. Limits are declared in ``TANGRAM_API_LIMITS`` (format:
:mod:`~tangram_celery.managers.basic.limits`) and enforced in Redis, so every worker on every host
draws from the same budget:

* **quota**: a token bucket per API (hash ``keys.api_tokens``), refilled continuously;
* **concurrency**: leases in a sorted set scored by expiry (``keys.api_leases``), renewed while
  the action runs, so a slot held by a worker that died comes back after the lease TTL;
* **order**: every waiting action holds a *ticket* in each API it needs (``keys.api_tickets``),
  scored by its place in one global order, and only the first live ticket of an API may take
  from it. The order is *oldest trajectory first*
  (:func:`~tangram_celery.scheduling.ordering.trajectory_order_key`): a call ranks by when its
  trajectory's first call was queued (``keys.api_trajectory_seen``), so trajectories under way
  finish and leave instead of all of a batch's trajectories crawling to the end together, which
  cuts the sum of ACT of a quota-bound batch. No call ranks later than its own arrival less
  ``TANGRAM_API_BYPASS_S`` (default 60 s), so a call is overtaken only by calls that arrived at
  most that long after it, and nobody waits forever; ``0`` is plain FCFS by arrival, the paper's
  order. The price is a longer tail, and a step shorter than a few bounds can end later (its
  youngest trajectories start late); ``python -m tangram_bench.api`` measures both orders.
  Tickets expire like leases when their worker stops renewing them.

An action whose cost names several APIs starts only when it is at the head of every one of them
and all of them have room: one Lua script checks every API and takes from all or from none.
Actions never fail or retry into a limit: they wait (in the worker, in that order) until the
script says yes.

Policy is pure (:func:`parse_api_limits`, :func:`needs_of`, :func:`decide`, :func:`pause_for`);
:class:`QuotaStore` is the Redis actuator (its Lua script implements :func:`decide` atomically,
and the tests check both agree case by case); :class:`ApiGate` is the worker-side waiting
room that asks the store on behalf of its first waiter in that order. They live in
:mod:`~tangram_celery.managers.basic.limits` (the declarations and what an action needs of
them), :mod:`~tangram_celery.managers.basic.policy` (the decision),
:mod:`~tangram_celery.managers.basic.store` (the Lua scripts and their Redis edge) and
:mod:`~tangram_celery.managers.basic.gate`.
"""

from __future__ import annotations

from tangram_celery.managers.basic.gate import ApiGate
from tangram_celery.managers.basic.limits import (
    ApiSpec,
    Need,
    Quota,
    needs_of,
    parse_api_limits,
    parse_duration,
)
from tangram_celery.managers.basic.policy import ApiState, Decision, decide, pause_for, refill
from tangram_celery.managers.basic.store import QuotaStore

__all__ = [
    "ApiGate",
    "ApiSpec",
    "ApiState",
    "Decision",
    "Need",
    "Quota",
    "QuotaStore",
    "decide",
    "needs_of",
    "parse_api_limits",
    "parse_duration",
    "pause_for",
    "refill",
]
