"""A client's trajectories that wait for memory, and the thread that places them.

:meth:`TangramClient.submit` does not block when a new trajectory's route is a
:class:`~tangram_celery.client.routing.MemoryWait`: it parks the action here and returns its
handle; the handle's result waits. While anything is parked, a thread renews this client's tickets
in the shared line (:mod:`tangram_celery.client.tickets`) and, every ``POLL_S``, routes its parked
trajectories again in the line's order (ticket numbers, not this client's clock, as
threads submit at once): once it is first in line and a node has the memory, it is pinned and its
parked actions are published in order, then the next one is tried. An action still parked at its
timeout (``timeout_s``, else ``TANGRAM_DEFAULT_TIMEOUT_S``, from its submission) is answered
``no_capacity`` with the memory it asked for and what the pool has; one the pool can no longer
ever hold (its nodes went away) is answered at once. Answers go to the action ledger, where the
handle's result finds them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
from kombu.exceptions import OperationalError

from tangram_celery.action import Action
from tangram_celery.client.router import Router
from tangram_celery.client.routing import MemoryWait, memory_wait_error
from tangram_celery.errors import NoCapacityError
from tangram_celery.pools.serving import rejected_result
from tangram_celery.tasks.ledger import Ledger

log = logging.getLogger(__name__)

POLL_S = 0.05
"""How often parked trajectories are routed again."""

Publish = Callable[[Action, str], None]


@dataclass
class Parked:
    """One trajectory's actions waiting for memory, oldest first."""

    wait: MemoryWait
    since: float
    actions: list[tuple[Action, float]] = field(default_factory=list)
    """Each action with its deadline (``time.time()``)."""


class Waitlist:
    """The parked trajectories of one client (thread-safe) and the thread that places them."""

    def __init__(self, router: Router, ledger: Ledger, publish: Publish,
                 default_timeout_s: float, least_wait_s: float = 0.0) -> None:
        self._router = router
        self._least_wait_s = least_wait_s
        self._ledger = ledger
        self._publish = publish
        self._default_timeout_s = default_timeout_s
        self._lock = threading.Lock()
        self._parked: dict[str, Parked] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def holds(self, trajectory_id: str) -> bool:
        """Whether the trajectory has actions parked here (a later one must queue behind)."""
        with self._lock:
            return trajectory_id in self._parked

    def park(self, action: Action, wait: MemoryWait | None, submitted: float) -> None:
        """Hold ``action`` until its trajectory is placed, or its timeout (``wait`` None: behind
        the trajectory's actions parked already)."""
        wait = wait or self._router.memory_wait(action)
        deadline = submitted + max(action.timeout_s or self._default_timeout_s, self._least_wait_s)
        with self._lock:
            entry = self._parked.setdefault(action.trajectory_id, Parked(wait, submitted))
            entry.actions.append((action, deadline))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="tangram-waitlist",
                                                daemon=True)
                self._thread.start()
        self._wake.set()

    def cancel(self, trajectory_id: str, reason: str) -> None:
        """Give up a parked trajectory: leave the line, answer its actions ``cancelled``."""
        with self._lock:
            entry = self._parked.pop(trajectory_id, None)
        if entry is None:
            return
        self._router.tickets.withdraw(trajectory_id)
        for action, _ in entry.actions:
            self._answer(action, f"cancelled: {reason}", "cancelled")

    def close(self) -> None:
        """Stop the thread; what is still parked leaves the line and is answered cancelled."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)
        with self._lock:
            waiting = list(self._parked)
        for trajectory_id in waiting:
            try:
                self.cancel(trajectory_id, "the client closed while the action waited for "
                                           "memory")
            except redis.RedisError as exc:
                log.warning("could not withdraw %s from the memory line: %s", trajectory_id, exc)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick(time.time())
                self.answer_dropped()
            except (redis.RedisError, OperationalError) as exc:
                log.info("memory waitlist: Redis did not answer (%s); trying again", exc)
            except Exception:
                log.exception("memory waitlist: unexpected error; trying again")
            with self._lock:
                busy = bool(self._parked)
            self._wake.wait(POLL_S if busy else None)
            self._wake.clear()

    def _tick(self, now: float) -> None:
        """Renew, expire, then place in the shared line's order until one cannot be placed:
        whoever is first of this client's trajectories in that line either is its head and
        does not fit, or waits behind another client's, and so do the ones after it."""
        with self._lock:
            parked = list(self._parked)
        self._router.tickets.renew(parked)
        for trajectory_id in parked:
            self._expire(trajectory_id, now)
        for trajectory_id in self._router.tickets.in_line_order(parked):
            if not self._try_place(trajectory_id):
                return

    def _expire(self, trajectory_id: str, now: float) -> None:
        """Answer the actions of a trajectory whose deadline passed; leave the line if none
        remain."""
        with self._lock:
            entry = self._parked.get(trajectory_id)
            if entry is None:
                return
            late = [a for a, deadline in entry.actions if deadline <= now]
            entry.actions = [(a, d) for a, d in entry.actions if d > now]
            empty = not entry.actions
            if empty:
                del self._parked[trajectory_id]
        if late:
            nodes = self._router.registry.nodes()
            for action in late:
                self._answer(action, memory_wait_error(action, entry.wait, now - entry.since,
                                                       nodes), "no_capacity")
        if empty:
            self._router.tickets.withdraw(trajectory_id)

    def _try_place(self, trajectory_id: str) -> bool:
        """Route the trajectory's first parked action again; True once it left the waitlist."""
        with self._lock:
            entry = self._parked.get(trajectory_id)
        if entry is None:
            return True
        first = entry.actions[0][0]
        try:
            decided = self._router.route(first)
        except NoCapacityError as exc:
            with self._lock:
                self._parked.pop(trajectory_id, None)
            self._router.tickets.withdraw(trajectory_id)
            for action, _ in entry.actions:
                self._answer(action, f"no_capacity: {exc}", "no_capacity")
            return True
        if decided.wait is not None:
            with self._lock:
                entry.wait = decided.wait
            return False
        with self._lock:
            self._release(trajectory_id)
        return True

    def _release(self, trajectory_id: str) -> None:
        """Publish the parked actions of a placed trajectory in order, under the lock so a
        later submission of it waits until they are out. Each is routed again (a later one may
        need more cores than its node has); when the broker fails, the rest stay parked. One
        cancelled or given up meanwhile gives its new pin back."""
        entry = self._parked.get(trajectory_id)
        if entry is None:
            self._router.registry.unpin(trajectory_id)
            return
        while entry.actions:
            action = entry.actions[0][0]
            try:
                self._publish(action, self._router.route(action).queue)
            except NoCapacityError as exc:
                self._answer(action, f"no_capacity: {exc}", "no_capacity")
            entry.actions.pop(0)
        self._parked.pop(trajectory_id, None)

    def answer_dropped(self) -> None:
        """Answer the actions of dead clients' tickets the router dropped from the line."""
        while self._router.dropped:
            ticket = self._router.dropped.pop()
            log.warning("dropped the memory ticket of trajectory %s: its client %s stopped "
                        "renewing it (it died); its actions %s are answered client_lost",
                        ticket.get("trajectory"), ticket.get("client"), ticket.get("actions"))
            for action_id in ticket.get("actions", ()):
                body = {"id": action_id, "trajectory_id": ticket.get("trajectory", ""),
                        "kind": "exec"}
                reason = ("client_lost: the client that submitted this action stopped while it "
                          "waited for memory; it was never run. Submit it again")
                self._ledger.store(str(action_id),
                                   rejected_result(body, reason, "", time.time(),
                                                   status="client_lost"))

    def _answer(self, action: Action, reason: str, status: str) -> None:
        log.warning("action %s: %s", action.id, reason)
        self._ledger.store(action.id, rejected_result(action.to_json(), reason, "", time.time(),
                                                      status=status))
