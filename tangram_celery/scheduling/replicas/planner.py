"""One GPU pool's plan at one scheduling point (`Planner`): each job in FCFS order books its
least-cost replica or restore (see `replicas`)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from tangram_celery.scheduling.replicas.board import Board, aligned_chunks
from tangram_celery.scheduling.replicas.config import ReplicaConfig
from tangram_celery.scheduling.residency import Chunk, Resident, plan_placement, service_name
from tangram_celery.scheduling.types import GpuPool, Job, Option, RunningJob, Service, Start

UNLIMITED_MB = 1 << 60
"""GPU memory of a pool that does not model it (residents never need evicting)."""


@dataclass(frozen=True)
class Booking:
    """Where and when one job is planned to run: on `chunk` from `start`, restoring its service
    first for `restore` seconds (0: resident), then running `duration` seconds; `cost` is what
    the plan minimised."""

    job_id: str
    chunk: Chunk
    start: float
    restore: float
    duration: float
    cost: float
    evict: tuple[str, ...] = ()

    @property
    def finish(self) -> float:
        """Expected completion."""
        return self.start + self.restore + self.duration


class Planner:
    """One pool's plan at one scheduling point (see `replicas`)."""

    def __init__(self, pool: GpuPool, jobs: Sequence[Job], running: Sequence[RunningJob],
                 now: float, config: ReplicaConfig, cap: int | None = None) -> None:
        self.pool = pool
        self.cap = cap
        self.now = now
        self.config = config
        self.board = Board(pool, running, now, config.fallback_duration)
        self.services = {service.name: service for service in pool.services}
        self.memory = pool.memory_mb or UNLIMITED_MB
        self.actual = {r.name: r for r in pool.residents}
        self.planned = dict(self.actual)
        self.busy_pins = frozenset(service_name(r.service, r.ids) for r in running
                                   if r.service and r.ids)
        self.booked: set[str] = set()
        self.later = Counter(job.service for job in jobs)
        self.tick = max((r.last_used for r in pool.residents), default=0)
        self.jobs = jobs
        self._chunks: dict[int, list[Chunk]] = {}
        self._occupied: dict[bool, frozenset[int]] = {}
        self._replicas: dict[tuple[str, int], list[Resident]] = {}
        self.bookings: dict[str, Booking] = {}
        self._restore: dict[tuple[str, int], float] = {}
        self._memory: dict[tuple[str, int], int] = {}

    def run(self) -> tuple[list[Start], list[str]]:
        """The starts (in queue order) and the jobs no chunk of the pool can ever serve."""
        starts: list[Start] = []
        unplaceable: list[str] = []
        for index, job in enumerate(self.jobs):
            if self.board.open_count <= 0 or index >= self.config.window:
                break
            self.later[job.service] -= 1
            if not self.servable(job):
                unplaceable.append(job.job_id)
                continue
            overdue = self.now - job.submitted_at >= self.config.max_bypass_s
            booking = self.best(job, len(self.jobs) - index - 1)
            if booking is None:
                if overdue:
                    break
                continue
            self.commit(job, booking)
            if booking.start <= self.now:
                starts.append(Start(job.job_id, self.pool.name, booking.chunk, booking.duration))
            elif not self.config.backfill:
                break
            elif overdue:
                self.board.close(booking.chunk)
        return starts, unplaceable

    def servable(self, job: Job) -> bool:
        """Whether some option of `job` is an aligned chunk whose memory fits a GPU."""
        return any(units <= self.pool.node_size and not units & (units - 1)
                   and self.memory_mb(job.service, units) <= self.memory
                   for units, _ in job.options)

    def best(self, job: Job, behind: int) -> Booking | None:
        """The least-cost booking of `job`, or None if no option fits the pool."""
        best: Booking | None = None
        best_key: tuple[float, ...] = (math.inf,)
        for units, expected in capped(job.options, self.cap):
            if units > self.pool.node_size or units & (units - 1):
                continue
            duration = self.config.fallback_duration if expected is None else expected
            for option in self.options(job, units, duration, behind, best_key[0]):
                key = (option.cost, option.restore > 0, len(option.evict), units,
                       option.chunk[0])
                if key < best_key:
                    best, best_key = option, key
        return best

    def backlog(self, behind: int, units: int, length: float) -> float:
        """The backlog term of holding `units` GPUs for `length` seconds: the GPU-seconds
        times the jobs queued behind per GPU of the pool."""
        return self.config.backlog_weight * behind * units * length / self.pool.total

    def options(self, job: Job, units: int, duration: float, behind: int,
                bound: float) -> list[Booking]:
        """The bookings of `job` on `units` GPUs worth comparing: every replica of its
        service at that size, and restores that could beat `bound`."""
        found = []
        run_cost = self.backlog(behind, units, duration)
        for resident in self.replicas(job.service, units):
            start = self.board.start_time(resident.chunk, duration)
            if start > self.now and not self.config.affinity:
                continue
            cost = start + duration + run_cost
            found.append(Booking(job.job_id, resident.chunk, start, 0.0, duration, cost))
            bound = min(bound, cost)
        restore = self.restore_s(job.service, units)
        length = restore + duration
        restore_cost = self.backlog(behind, units, length)
        if self.now + length + restore_cost > bound:
            return found
        resident_chunks = {r.chunk for r in self.replicas(job.service, units)}
        candidates = sorted((self.board.start_time(chunk, length), chunk)
                            for chunk in self.chunks(units) if chunk not in resident_chunks)
        for start, chunk in candidates:
            cost = start + length + restore_cost
            if cost > bound:
                break
            if not job.service or self.occupied(start).isdisjoint(chunk):
                found.append(Booking(job.job_id, chunk, start, restore, duration, cost))
                break
            evicted = self.evictions(job.service, chunk, units, start)
            if evicted is None:
                continue
            cost += sum(self.penalty(resident) for resident in evicted)
            found.append(Booking(job.job_id, chunk, start, restore, duration, cost,
                                 tuple(r.name for r in evicted)))
            bound = min(bound, cost)
        return found

    def chunks(self, units: int) -> list[Chunk]:
        """The pool's aligned chunks of `units` GPUs."""
        cached = self._chunks.get(units)
        if cached is None:
            cached = self._chunks[units] = aligned_chunks(self.pool.total, units)
        return cached

    def occupied(self, start: float) -> frozenset[int]:
        """The GPUs holding a resident in the view a start at `start` plans with."""
        now = start <= self.now
        cached = self._occupied.get(now)
        if cached is None:
            view = self.actual if now else self.planned
            cached = self._occupied[now] = frozenset(g for r in view.values() for g in r.chunk)
        return cached

    def replicas(self, service: str, units: int) -> list[Resident]:
        """The planned residents of `service` on chunks of `units` GPUs."""
        if not service:
            return []
        cached = self._replicas.get((service, units))
        if cached is None:
            cached = self._replicas[(service, units)] = [
                r for r in self.planned.values() if r.model == service and len(r.chunk) == units
            ]
        return cached

    def restore_s(self, service: str, units: int) -> float:
        """Seconds to restore `service` onto `units` GPUs (0 for a job without a service)."""
        key = (service, units)
        cached = self._restore.get(key)
        if cached is None:
            known = self.services.get(service, Service(service)).restore_at(units)
            cached = self._restore[key] = (
                0.0 if not service else self.config.default_restore_s if known is None
                else known)
        return cached

    def memory_mb(self, service: str, units: int) -> int:
        """Memory per GPU `service` needs on `units` GPUs."""
        key = (service, units)
        cached = self._memory.get(key)
        if cached is None:
            cached = self._memory[key] = (
                self.services.get(service, Service(service)).memory_at(units))
        return cached

    def evictions(self, service: str, chunk: Chunk, units: int,
                  start: float) -> list[Resident] | None:
        """The residents restoring `service` on `chunk` unloads, as the GPU manager will plan
        it; None if it does not fit or would unload a replica an earlier job has booked."""
        if not service:
            return []
        view = self.actual if start <= self.now else self.planned
        placement = plan_placement(view, service, chunk, self.memory_mb(service, units),
                                   self.memory, self.busy_pins)
        if not placement.fits or self.booked.intersection(placement.evict):
            return None
        return [view[name] for name in placement.evict]

    def penalty(self, resident: Resident) -> float:
        """What unloading `resident` costs the queue: its restore time if later jobs ask for
        its service."""
        if self.later[resident.model] <= 0 or not self.config.spare:
            return 0.0
        return self.restore_s(resident.model, len(resident.chunk))

    def commit(self, job: Job, booking: Booking) -> None:
        """Book `booking`: hold its GPUs and, for a restore, update the residents."""
        self.bookings[job.job_id] = booking
        self.board.book(booking.chunk, booking.start, booking.restore + booking.duration)
        if not job.service:
            return
        name = service_name(job.service, booking.chunk)
        if booking.start <= self.now:
            self.busy_pins |= {name}
        self.tick += 1
        views = [self.planned, self.actual] if booking.start <= self.now else [self.planned]
        if booking.evict or any(name not in view for view in views):
            self._occupied.clear()
            self._replicas.clear()
        for view in views:
            for evicted in booking.evict:
                view.pop(evicted, None)
            view[name] = Resident(name, job.service, booking.chunk,
                                  self.memory_mb(job.service, len(booking.chunk)), self.tick)
        self.booked.add(name)


def capped(options: Sequence[Option], cap: int | None) -> Sequence[Option]:
    """The options of at most `cap` units (the smallest one if none is that small)."""
    if cap is None:
        return options
    kept = [option for option in options if option[0] <= cap]
    return kept or options[:1]
