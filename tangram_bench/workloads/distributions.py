"""Seeded draws shared by the workload generators.

Every trajectory gets its own generator, seeded from (workload seed, trajectory index), so a
smaller batch is a prefix of a larger one with the same seed and a sweep over batch sizes
compares like with like.
"""

from __future__ import annotations

import math
import random


def trajectory_rng(seed: int, name: str, index: int) -> random.Random:
    """The generator of trajectory ``index`` of workload ``name`` (string seeds are stable)."""
    return random.Random(f"{name}:{seed}:{index}")


def clipped_lognormal(
    rng: random.Random, median: float, sigma: float, low: float, high: float
) -> float:
    """A log-normal draw with the given median and log-space sigma, clipped to [low, high]."""
    return min(max(rng.lognormvariate(math.log(median), sigma), low), high)


def dirichlet(rng: random.Random, alpha: float, size: int) -> list[float]:
    """A symmetric Dirichlet draw: ``size`` shares summing to 1 (small alpha: very uneven)."""
    draws = [rng.gammavariate(alpha, 1.0) for _ in range(size)]
    total = sum(draws) or 1.0
    return [d / total for d in draws]
