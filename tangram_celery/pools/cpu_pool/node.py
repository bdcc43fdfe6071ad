"""The CPU node runtime: what a node worker does with each action message.

It validates the message again (workers never trust producers), waits in the node's admission
gate for exclusive cores, runs the command in the trajectory's sandbox on exactly those cores,
gives the cores back whatever happens, and returns the result with its timestamps.

**Core loans** (with the robust scheduler, on a sandbox backend that can re-pin a running
action): a short action that the gate does not admit at once may start on a core lent by a
running action while its request waits in the gate; :mod:`tangram_celery.pools.cpu_pool.loans`
describes them and keeps their state.

**Malleable runs** (``TANGRAM_MALLEABLE_RESIZE=1``): the node grows and shrinks its running
malleable test runs (:mod:`tangram_celery.pools.cpu_pool.resizing`).

**Fencing**: a node whose heartbeat has not reached Redis for ``TANGRAM_NODE_TTL_S`` starts no
action until it has registered again, and kills its running ones with
``TANGRAM_FENCE_RUNNING=kill`` (:mod:`tangram_celery.pools.fence`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tangram_celery.action import Action, ActionResult, Timings, parse_action
from tangram_celery.connection import DURABILITY
from tangram_celery.errors import SandboxError, ValidationError
from tangram_celery.pools.admission import (
    Admission,
    AllocationRecord,
    Policy,
    Request,
    fcfs_minimum,
)
from tangram_celery.pools.conversion import (
    MALLEABLE_CONTROL,
    action_limits,
    outcome_status,
    request_for,
    scheduler_job,
    signature_of,
)
from tangram_celery.pools.cpu_pool.duration_sharing import SharedDurations
from tangram_celery.pools.cpu_pool.loans import CoreLoans
from tangram_celery.pools.cpu_pool.resizing import MalleableRuns, reaches_runs, resized_run
from tangram_celery.pools.cpu_pool.steps import Ran, run_action
from tangram_celery.pools.fence import Fence
from tangram_celery.pools.registry import Registry
from tangram_celery.pools.serving import Heartbeat, rejected_result
from tangram_celery.sandbox import SandboxBackend
from tangram_celery.scheduling import DurationModel, Job
from tangram_celery.scheduling.learned import learn
from tangram_celery.scheduling.lending import LoanConfig
from tangram_celery.scheduling.malleable import node_config
from tangram_celery.scheduling.robust import RobustConfig, loan_config
from tangram_celery.settings import Settings

log = logging.getLogger(__name__)


class CpuNode:
    """One CPU node: its cores, its sandboxes, its admission gate and its Redis registration.

    ``loans``: the loan settings (default: on with the robust scheduler, where the sandbox
    backend can re-pin running actions; see :mod:`tangram_celery.pools.cpu_pool.loans`)."""

    def __init__(
        self,
        settings: Settings,
        name: str,
        cores: int,
        cpus: Sequence[int],
        memory_mb: float,
        sandbox: SandboxBackend,
        registry: Registry | None = None,
        policy: Policy = fcfs_minimum,
        model: DurationModel | None = None,
        loans: LoanConfig | None = None,
        shared: SharedDurations | None = None,
        answered: Callable[[str], dict[str, Any] | None] | None = None,
    ) -> None:
        self.settings = settings
        self.name = name
        self.memory_mb = memory_mb
        self.sandbox = sandbox
        self.registry = registry
        self.admission = Admission(range(cores), policy)
        self.cpus = tuple(cpus)
        self.model = shared.model if shared is not None else model or DurationModel()
        self.shared = shared
        self._limits = action_limits(settings)
        config = loans or loan_config(RobustConfig(loans=settings.node.scheduler == "robust"))
        self.loans = CoreLoans(config, sandbox.repin if sandbox.repins else None, self.physical)
        self._heartbeat = Heartbeat(f"tangram-heartbeat-{name}", settings.node.heartbeat_s,
                                    self._beat)
        self._sync = None if shared is None else Heartbeat(
            f"tangram-durations-{name}", shared.every_s, self._catch_up)
        self.fence = Fence(f"CPU node {name}", settings.node.ttl_s, answered, self._fenced)
        self._running: dict[str, str] = {}
        self._killed: set[str] = set()
        self._running_lock = threading.Lock()
        self.malleable = self._malleable_runs()

    def _malleable_runs(self) -> MalleableRuns | None:
        """The resizer of malleable runs, where it is turned on and the backend can do it (it
        re-pins running actions and knows their work dirs). On a node whose units share CPUs
        a run's cpuset is the set of its units' CPUs, as for any action there."""
        node = self.settings.node
        if not (node.malleable_resize and self.sandbox.repins and reaches_runs(self.sandbox)):
            return None
        runs = MalleableRuns(self.admission, self.sandbox, lambda u: self.cpus[u],
                             node_config(node.malleable_start_s, node.malleable_weighting),
                             node.malleable_tick_s, self._audit_record, self.loans.resized)
        self.admission.on_wait = runs.poke
        return runs

    def start(self) -> None:
        """Say what the sandbox enforces, register the node and start its heartbeat and its
        fence."""
        isolation = self.sandbox.isolation
        if isolation.gaps:
            log.warning("node %s: sandbox isolation %s; why: %s", self.name, isolation.summary(),
                        "; ".join(isolation.reasons))
        else:
            log.info("node %s: sandbox isolation %s", self.name, isolation.summary())
        if self.malleable is not None:
            self.malleable.start()
        if self.registry is None:
            return
        self._register()
        self.fence.start()
        self._heartbeat.start()
        if self._sync is not None:
            self._sync.start()

    def stop(self) -> None:
        """Deregister, stop the heartbeat and remove every sandbox of this node."""
        self._heartbeat.stop()
        self.fence.stop()
        if self.malleable is not None:
            self.malleable.stop()
        if self._sync is not None:
            self._sync.stop()
        if self.registry is not None:
            try:
                self.registry.deregister_node(self.name)
            except Exception:
                log.warning("could not deregister node %s", self.name, exc_info=True)
        self.sandbox.close()

    def execute(self, message: Mapping[str, Any], received: float) -> dict[str, Any]:
        """Run one action message to completion; never raises for a bad message."""
        try:
            action = parse_action(message, self._limits)
        except ValidationError as exc:
            return rejected_result(message, str(exc), self.name, received)
        if action.pool != "cpu":
            return rejected_result(message, f"{action.kind} actions do not run on CPU nodes",
                                   self.name, received)
        return self._run(action, received).to_json()

    def physical(self, units: Sequence[int]) -> tuple[int, ...]:
        """The host CPUs backing logical unit ids (units share CPUs when oversubscribed)."""
        return tuple(sorted({self.cpus[u % len(self.cpus)] for u in units}))

    def end_trajectory(self, trajectory_id: str) -> None:
        """Remove a trajectory's environment and give its memory reservation back."""
        self.sandbox.end_trajectory(trajectory_id)
        if self.registry is not None:
            self.registry.unpin(trajectory_id)

    def _run(self, action: Action, received: float) -> ActionResult:
        timings = Timings(received=received)
        result = ActionResult(action.id, action.trajectory_id, action.kind, "error",
                              node=self.name, timings=timings,
                              isolation=self.sandbox.isolation.summary())
        mark = self.fence.mark()
        request = request_for(action, received, self.model, prior=True)
        cores, borrowed = self._admit(action, request)
        timings.admitted = time.time()
        timings.sched_s = self.admission.decision_s(action.id)
        result.units = cores
        resized = not borrowed and self._watch(action, cores, received)
        try:
            self.fence.enter(action.id, mark)
            ran = self._tracked(action, cores,
                                malleable=resized or action.payload.get("malleable") is True)
        except (SandboxError, ValidationError) as exc:
            result.error = str(exc)
            timings.exec_started = timings.exec_finished = time.time()
        else:
            outcome = ran.last
            result.status = outcome_status(outcome)
            result.output = ran.output
            timings.exec_started = ran.outcomes[0].started_at
            timings.exec_finished = outcome.finished_at
            timings.exec_s, timings.setup_s = ran.exec_s, ran.outcomes[0].setup_s
            units = len(cores) if self.malleable is None \
                else self.malleable.ended(action.id, len(cores))
            if action.signature and not outcome.timed_out and not self.loans.lent_ever(action.id):
                self._learn(signature_of(action), units, outcome.exec_s)
        finally:
            if self.malleable is not None:
                self.malleable.remove(action.id)
            if borrowed:
                self._settle(*self.loans.ended(action.id))
            else:
                self._close_allocation(action.id)
            if self.malleable is not None:
                self.malleable.poke()
            if action.ephemeral:
                self._unpin(action.trajectory_id)
        timings.stored = time.time()
        if self._was_killed(action.id):
            result.status = "node_lost"
            result.error = (f"node_lost: CPU node {self.name} was cut off from Redis for over "
                            f"{self.settings.node.ttl_s:g} s and killed its running actions "
                            "(TANGRAM_FENCE_RUNNING=kill) with their environments")
        return result

    def _watch(self, action: Action, cores: tuple[int, ...], received: float) -> bool:
        """Hand ``action`` to the resizer when the node resizes it while it runs; whether it
        does."""
        if self.malleable is None or not self._resizable(action):
            return False
        single = dict(request_for(action, received, self.model).options).get(1)
        self.malleable.add(action.id, action.trajectory_id, cores, MALLEABLE_CONTROL, single)
        return True

    def _resizable(self, action: Action) -> bool:
        """Whether the node resizes ``action`` while it runs (it then never lends cores):
        :func:`~tangram_celery.pools.cpu_pool.resizing.resized_run` over its signature's
        learned single-core duration."""
        if self.malleable is None:
            return False
        single = dict(request_for(action, time.time(), self.model).options).get(1)
        return resized_run(action, single, self.malleable.config)

    def _unpin(self, trajectory_id: str) -> None:
        """Give back a one-request trajectory's memory reservation."""
        if self.registry is None:
            return
        try:
            self.registry.unpin(trajectory_id)
        except Exception:  # its pin then ends with the trajectory TTL
            log.warning("could not unpin trajectory %s", trajectory_id, exc_info=True)

    def _tracked(self, action: Action, cores: tuple[int, ...], *, malleable: bool) -> Ran:
        """Run ``action`` on ``cores``, known as running (for a fence that kills) meanwhile."""
        with self._running_lock:
            self._running[action.id] = action.trajectory_id
        try:
            return run_action(self.sandbox, action, cores, self.physical(cores),
                              self.settings.actions.default_timeout_s, malleable=malleable)
        finally:
            with self._running_lock:
                self._running.pop(action.id, None)

    def _fenced(self) -> None:
        """The fence closed: with ``TANGRAM_FENCE_RUNNING=kill``, kill the running actions
        with their trajectories' environments (the clients answer them ``node_lost``)."""
        if self.settings.node.fence_running != "kill":
            return
        with self._running_lock:
            running = dict(self._running)
            self._killed.update(running)
        for action_id, trajectory_id in running.items():
            log.warning("node %s fenced: killing action %s", self.name, action_id)
            threading.Thread(target=self.sandbox.end_trajectory, args=(trajectory_id,),
                             name=f"tangram-fence-kill-{action_id}", daemon=True).start()

    def _was_killed(self, action_id: str) -> bool:
        with self._running_lock:
            if action_id in self._killed:
                self._killed.discard(action_id)
                return True
            return False

    def _register(self) -> None:
        if self.registry is not None:
            self.registry.register_node(self.name, self.admission.total, self.memory_mb,
                                        self.sandbox.isolation.summary())

    def _catch_up(self) -> None:
        if self.shared is not None:
            self.shared.catch_up()

    def _learn(self, signature: tuple[str, str], units: int, seconds: float) -> None:
        if self.shared is not None:
            self.shared.learn(signature, units, seconds)
        else:
            learn(self.model, signature, units, seconds)

    def _admit(self, action: Action, request: Request) -> tuple[tuple[int, ...], bool]:
        """Cores from the gate, or, for a short action the gate does not admit at once, a lent
        core while its request waits in the gate (see :mod:`tangram_celery.pools.cpu_pool.loans`);
        waits in the gate when no core can be lent. Returns the cores and whether they are lent."""
        job = scheduler_job(request)
        short = self.loans.is_short(job)
        with self.loans.waiting(action.id, job):
            quick = self._lent_or_at_once(action, request, job)
            if quick is not None:
                return quick
            cores = self.admission.acquire(request)
        lends = not short and not self._resizable(action)
        self.loans.hold(action.id, action.trajectory_id, request, cores, lends)
        return cores, False

    def _lent_or_at_once(self, action: Action, request: Request, job: Job
                         ) -> tuple[tuple[int, ...], bool] | None:
        """For an action that may borrow: its own cores if the gate admits it at once, else a
        loan (its request then waits in the gate on a thread of its own); None when neither."""
        if not self.loans.may_borrow(job):
            return None
        try:
            cores = self.admission.acquire(request, timeout=0)
        except TimeoutError:
            loan = self.loans.borrow(job, action.trajectory_id)
            if loan is None:
                return None
            threading.Thread(target=self._await_own, args=(action.id, request),
                             name=f"tangram-loan-{action.id}", daemon=True).start()
            return loan.units, True
        self.loans.hold(action.id, action.trajectory_id, request, cores, False)
        return cores, False

    def _await_own(self, action_id: str, request: Request) -> None:
        """A borrower's request waits in the gate (in its arrival order); when admitted, the
        borrower moves onto its own cores."""
        try:
            cores = self.admission.acquire(request)
        except Exception:  # the borrower keeps its loan to its end
            log.warning("the request of borrower %s failed in the gate", action_id,
                        exc_info=True)
            return
        self.admission.decision_s(action_id)
        self._settle(*self.loans.admitted(action_id, request, cores))

    def _settle(self, release: Sequence[str], entry: Mapping[str, Any] | None) -> None:
        """Audit a closed loan; release the allocations whose time has come."""
        if entry is not None:
            self._audit({**entry, "total": self.admission.total})
        for action_id in release:
            self._close_allocation(action_id)

    def _close_allocation(self, action_id: str) -> None:
        extra = self.loans.close(action_id)
        if extra is None:
            return  # it lends: released when its last loan ends
        record = self.admission.release(action_id)
        if record is None:
            return
        self._audit({"action_id": record.action_id, "units": list(record.units),
                     "start": record.start, "end": record.end, "total": self.admission.total,
                     **extra})

    def _audit_record(self, record: AllocationRecord) -> None:
        """Audit the part of a malleable run's allocation that ended when it was resized."""
        self._audit({"action_id": record.action_id, "units": list(record.units),
                     "start": record.start, "end": record.end, "total": self.admission.total,
                     "resized": True})

    def _audit(self, entry: Mapping[str, Any]) -> None:
        """Append an allocation to the node's audit trail: the gate's allocations (with the
        loans made from them, ``lent``) and the loans themselves (``lent_by``)."""
        if self.registry is None:
            return
        try:
            self.registry.record_allocation(self.name, entry)
        except Exception:  # the audit trail must not fail the action
            log.warning("could not record the allocation of %s", entry["action_id"],
                        exc_info=True)

    def _beat(self) -> None:
        registry = self.registry
        if registry is None:
            return
        self.fence.beat(lambda: registry.heartbeat(
            self.name, self.admission.free_count(),
            (self.admission.policy_calls, self.admission.policy_s), DURABILITY.snapshot()),
            self._register)
