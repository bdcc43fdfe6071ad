"""What the demand forecast leaves a pool's elastic jobs and keeps for short ones: the
load-aware DoP cap and the reserve (see `robust`)."""

from __future__ import annotations

import math

from tangram_celery.scheduling.demand import Demand
from tangram_celery.scheduling.robust.config import RobustConfig


def reserve_units(demand: Demand, total: int, config: RobustConfig) -> int:
    """Units kept for short jobs: square-root staffing of their predicted load, bounded."""
    load = demand.short_load
    if not config.reserve or load <= 0:
        return 0
    wanted = math.ceil(load + config.reserve_z * math.sqrt(load))
    return max(min(wanted, math.floor(config.max_reserve * total), _slack(demand, total)), 0)


def _slack(demand: Demand, total: int) -> int:
    """Units the forecast leaves idle with every elastic job at one unit (the least work)."""
    least = demand.elastic_rate * demand.elastic_time[0] if demand.elastic_time else 0.0
    return math.floor(total - demand.short_load - demand.long_load - least)


CAPS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
"""The caps `dop_cap` chooses among."""


def dop_cap(demand: Demand, total: int, config: RobustConfig) -> int | None:
    """The cap with the least predicted elastic ACT, or None for no cap (see `robust`)."""
    time, rate = demand.elastic_time, demand.elastic_rate
    if not config.cap or rate <= 0 or not time:
        return None
    room = max(total - demand.short_load - demand.long_load, 1.0) * config.utilisation
    caps = [cap for cap in CAPS if cap <= len(time)]
    acts = [predicted_act(rate, time[cap - 1], room / cap, config.burstiness) for cap in caps]
    best = caps[acts.index(min(acts))]
    return None if best >= len(time) else best


def predicted_act(rate: float, service: float, servers: float, burstiness: float = 1.0) -> float:
    """Mean time in an M/M/c queue with `servers` servers (Sakasegawa's approximation of the
    wait, times `burstiness`). Overloaded: a huge value growing with the load, so the least
    overloaded choice wins."""
    c = max(math.floor(servers), 1)
    rho = rate * service / c
    if rho >= 1:
        return OVERLOADED * rho
    wait: float = rho ** math.sqrt(2 * (c + 1)) / (c * (1 - rho)) * service * burstiness
    return service + wait


OVERLOADED = 1e12
"""Scale of `predicted_act` for an overloaded queue."""


def elastic_cap(demand: Demand, total: int, config: RobustConfig) -> int:
    """The most units any elastic job may get under the forecast: the DoP cap (`dop_cap`;
    the pool if none), within `max_units`."""
    cap = dop_cap(demand, total, config)
    most = min(total, config.max_units or total)
    return most if cap is None else min(cap, most)
