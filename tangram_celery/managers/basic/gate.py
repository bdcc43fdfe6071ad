"""The basic manager's worker-side gate: where a worker's API actions wait, in the store's order."""

from __future__ import annotations

import bisect
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import redis

from tangram_celery.errors import ServiceError
from tangram_celery.managers.basic.limits import DEFAULT_LEASE_S, Need
from tangram_celery.managers.basic.policy import LOST, pause_for
from tangram_celery.managers.basic.store import Grant, QuotaStore

log = logging.getLogger(__name__)

POLL_S = 0.005
MAX_PAUSE_S = 0.25
ERROR_PAUSE_S = 0.1


@dataclass
class _Waiter:
    score: float
    ticket: str
    needs: tuple[Need, ...]
    event: threading.Event = field(default_factory=threading.Event)
    trajectory: str | None = None
    grant: Grant | None = None
    abandoned: bool = False
    error: BaseException | None = None


def _place(waiter: _Waiter) -> tuple[float, str]:
    """A waiter's place: its score, ties by ticket, as Redis orders a sorted set."""
    return waiter.score, waiter.ticket


class ApiGate:
    """A worker's waiting room for API actions, in the store's order.

    Threads call :meth:`acquire` and block; one pump thread asks the :class:`QuotaStore` on
    behalf of the first local waiter only (the store itself enforces the global order), sleeps
    as :func:`pause_for` says, and renews the tickets of waiters and the leases of running
    actions. :meth:`release` gives slots back and wakes the pump at once.
    """

    def __init__(
        self,
        store: QuotaStore,
        poll_s: float = POLL_S,
        max_pause_s: float = MAX_PAUSE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self._poll_s = poll_s
        self._max_pause_s = max_pause_s
        self._clock = clock
        leases = [s.lease_s for s in store.specs.values()] or [DEFAULT_LEASE_S]
        self._renew_every_s = min(leases) / 3
        self._lock = threading.Lock()
        self._waiting: list[_Waiter] = []
        self._held: dict[str, Grant] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the pump thread (idempotent; :meth:`acquire` starts it too)."""
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._pump, name="tangram-api-gate",
                                                daemon=True)
                self._thread.start()

    def stop(self) -> None:
        """Stop the pump; waiters still queued get :class:`ServiceError`, tickets withdrawn."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            self._safe(functools.partial(self.store.cancel, waiter.ticket, waiter.needs))
            waiter.error = ServiceError("the API worker is shutting down; resubmit the action")
            waiter.event.set()

    def waiting_count(self) -> int:
        """Actions of this worker waiting for their APIs."""
        with self._lock:
            return len(self._waiting)

    def held_count(self) -> int:
        """Actions of this worker holding their APIs."""
        with self._lock:
            return len(self._held)

    def acquire(self, action_id: str, needs: Sequence[Need],
                timeout: float | None = None, trajectory: str | None = None) -> Grant:
        """Block until the action (a call of ``trajectory``, whose place in the order it takes)
        may call its APIs; returns the grant to :meth:`release`.

        Raises ``TimeoutError`` after ``timeout`` seconds (the ticket is withdrawn) and
        :class:`ServiceError` if the worker stops first.
        """
        if self._stop.is_set():
            raise ServiceError("the API worker is shutting down; resubmit the action")
        ticket = f"{action_id}:{uuid.uuid4().hex[:8]}"
        if not needs:
            return Grant(ticket, (), self._clock())
        self.start()
        waiter = _Waiter(self.store.register(ticket, needs, trajectory=trajectory), ticket,
                         tuple(needs), trajectory=trajectory)
        with self._lock:
            bisect.insort(self._waiting, waiter, key=_place)
        self._wake.set()
        if not waiter.event.wait(timeout):
            with self._lock:
                if not waiter.event.is_set():
                    waiter.abandoned = True
                    if waiter in self._waiting:
                        self._waiting.remove(waiter)
            if waiter.abandoned:
                self.store.cancel(ticket, waiter.needs)
                raise TimeoutError(f"action {action_id} got no API slot within {timeout} s")
        if waiter.error is not None:
            raise waiter.error
        assert waiter.grant is not None
        return waiter.grant

    def release(self, grant: Grant) -> None:
        """Give a grant's concurrency slots back (safe to call once per grant)."""
        with self._lock:
            if self._held.pop(grant.ticket, None) is None:
                return
        self._safe(lambda: self.store.release(grant))
        self._wake.set()

    def _pump(self) -> None:
        next_renewal = self._clock() + self._renew_every_s
        while not self._stop.is_set():
            if self._clock() >= next_renewal:
                self._renew()
                next_renewal = self._clock() + self._renew_every_s
            with self._lock:
                head = self._waiting[0] if self._waiting else None
            pause = next_renewal - self._clock() if head is None else self._serve(head)
            if pause > 0:
                self._wake.wait(min(pause, max(next_renewal - self._clock(), 0.0)))
                self._wake.clear()

    def _serve(self, head: _Waiter) -> float:
        try:
            decision = self.store.try_acquire(head.ticket, head.needs)
            if decision.reason == LOST:
                self._requeue(head)
        except redis.RedisError:
            log.warning("API gate could not reach Redis; retrying", exc_info=True)
            return ERROR_PAUSE_S
        except Exception as exc:  # a bug must fail one action, not hang every waiter
            log.exception("API gate failed on ticket %s", head.ticket)
            self._fail(head, ServiceError(f"the API gate failed: {exc!r}"))
            return 0.0
        if decision.granted:
            self._hand_over(head)
            return 0.0
        return pause_for(decision, self._poll_s, self._max_pause_s)

    def _hand_over(self, head: _Waiter) -> None:
        grant = Grant(head.ticket, head.needs, self._clock())
        with self._lock:
            abandoned = head.abandoned
            if not abandoned:
                self._waiting.remove(head)
                self._held[grant.ticket] = grant
                head.grant = grant
                head.event.set()
        if abandoned:
            self._safe(lambda: self.store.release(grant))

    def _fail(self, head: _Waiter, error: ServiceError) -> None:
        with self._lock:
            if head in self._waiting:
                self._waiting.remove(head)
        self._safe(functools.partial(self.store.cancel, head.ticket, head.needs))
        head.error = error
        head.event.set()

    def _requeue(self, head: _Waiter) -> None:
        log.warning("ticket %s expired while waiting (worker stalled?); queueing it again",
                    head.ticket)
        with self._lock:
            if head not in self._waiting:
                return
        score = self.store.register(head.ticket, head.needs, trajectory=head.trajectory)
        with self._lock:
            still_waiting = head in self._waiting
            if still_waiting:
                self._waiting.remove(head)
                head.score = score
                bisect.insort(self._waiting, head, key=_place)
        if not still_waiting:  # it timed out meanwhile: leave no orphan ticket behind
            self.store.cancel(head.ticket, head.needs)

    def _renew(self) -> None:
        with self._lock:
            waiting = [(w.ticket, w.needs) for w in self._waiting]
            held = list(self._held.values())
        if waiting or held:
            self._safe(lambda: self.store.renew(waiting, held))

    @staticmethod
    def _safe(call: Callable[[], object]) -> None:
        try:
            call()
        except redis.RedisError:
            log.warning("basic manager: Redis call failed", exc_info=True)
