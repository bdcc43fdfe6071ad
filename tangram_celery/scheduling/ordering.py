"""Queue orderings: the order in which `decide` considers waiting jobs.

FCFS is the default. Any policy must keep starvation impossible: `decide` admits candidates
as a prefix of the ordered queue, so a job at the head is blocked only until enough units free
up, and a policy only has to guarantee that every job reaches the head in bounded time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Protocol

from tangram_celery.scheduling.types import Job

DEFAULT_BYPASS_S = 60.0
"""The default bypass bound of :func:`trajectory_order_key` (``TANGRAM_API_BYPASS_S``)."""


class Ordering(Protocol):
    """A queue ordering policy."""

    def order(self, jobs: Sequence[Job], now: float) -> tuple[Job, ...]:
        """The jobs in the order `decide` should consider them at time `now`."""
        ...


@dataclass(frozen=True)
class Fcfs:
    """First come, first served: by submission time, ties kept in the given order."""

    def order(self, jobs: Sequence[Job], now: float) -> tuple[Job, ...]:
        """Jobs sorted by `submitted_at` (stable)."""
        del now
        return tuple(sorted(jobs, key=attrgetter("submitted_at")))


@dataclass(frozen=True)
class ShortestFirst:
    """Shortest expected minimum-unit duration first, with aging so nothing waits forever.

    Jobs that have waited at least `max_wait` come first, in FCFS order among themselves; the
    rest follow by expected duration at their minimum (unknown durations count as
    `unknown_duration`, by default last), ties by submission time. A job therefore overtakes
    newer short jobs once it is `max_wait` old, and from then on waits only behind older
    aged jobs.
    """

    max_wait: float = 60.0
    unknown_duration: float = math.inf

    def order(self, jobs: Sequence[Job], now: float) -> tuple[Job, ...]:
        """Aged jobs in FCFS order, then the others shortest first."""
        fcfs = Fcfs().order(jobs, now)
        aged = tuple(job for job in fcfs if now - job.submitted_at >= self.max_wait)
        fresh = [job for job in fcfs if now - job.submitted_at < self.max_wait]
        fresh.sort(key=lambda job: (self._expected(job), job.submitted_at))
        return aged + tuple(fresh)

    def _expected(self, job: Job) -> float:
        duration = job.options[0][1]
        return self.unknown_duration if duration is None else duration


def trajectory_order_key(first_seen: float, arrived: float, bypass_s: float) -> float:
    """The place of an action in *oldest trajectory first* order, with a starvation bound.

    Actions are served by when their trajectory was first seen (``first_seen``), not by when they
    arrived, so the trajectories already under way finish first and leave, instead of every
    trajectory of a batch crawling to the end together. An action's key never exceeds its own
    arrival time less ``bypass_s``, so it is overtaken only by actions that arrived at most
    ``bypass_s`` after it; ``bypass_s = 0`` is plain FCFS by arrival. Smaller keys go first.
    """
    if bypass_s < 0:
        raise ValueError("bypass_s must be >= 0")
    return max(min(first_seen, arrived), arrived - bypass_s)
