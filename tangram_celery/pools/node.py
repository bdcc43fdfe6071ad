"""The CPU node runtime: what a node worker does with each action message.

It validates the message again (workers never trust producers), waits in the node's admission
gate for exclusive cores, runs the command in the trajectory's sandbox on exactly those cores,
gives the cores back whatever happens, and returns the result with its timestamps.

**Core loans** (with the robust scheduler, on a sandbox backend that can re-pin a running
action: ``repin``, the embedded bwrap backend with a writable cpuset controller): a short
action that the gate does not admit at once starts anyway, on a core lent by a running action
(`tangram_celery.scheduling.loans` chooses the lender), while its request waits in the gate
as before. The lender's cpuset shrinks to the cores it keeps and the borrower runs alone on
the lent core, so no core is ever in two actions' cpusets. When the gate admits the request,
the borrower moves onto the cores it was given and the lender has its core back; a borrower
that ends first gives the core back at once and releases its grant the moment it comes (a
request cannot be withdrawn from the gate). A lender that ends while it lends keeps its
allocation until its loans end (the gate releases an allocation as a whole). Without a lender
the action waits in the gate as before. `CoreLoans` keeps this state.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tangram_celery.action import Action, ActionLimits, ActionResult, Timings, parse_action
from tangram_celery.errors import SandboxError, ValidationError
from tangram_celery.pools.admission import Admission, Policy, Request, fcfs_minimum
from tangram_celery.pools.registry import Registry
from tangram_celery.pools.serving import Heartbeat, rejected_result
from tangram_celery.sandbox import ExecOutcome, ExecSpec, SandboxBackend, rewrite_parallelism
from tangram_celery.scheduling import DurationModel, Job, Signature
from tangram_celery.scheduling.demand import job_class
from tangram_celery.scheduling.loans import Holder, Loan, LoanConfig, plan_loans, slowed
from tangram_celery.scheduling.robust import RobustConfig, loan_config
from tangram_celery.settings import Settings

log = logging.getLogger(__name__)

SANDBOX_PYTHON = "/usr/bin/python3"


def action_limits(settings: Settings) -> ActionLimits:
    """The validation bounds that follow from the settings."""
    return ActionLimits(
        max_payload_bytes=settings.max_payload_bytes,
        max_timeout_s=settings.max_timeout_s,
        apis=frozenset(api_names(settings.api_limits)),
        extra_resources=frozenset(settings.extra_resources),
    )


def api_names(api_limits: str) -> list[str]:
    """Names of the APIs declared in ``TANGRAM_API_LIMITS``; raises ``ConfigError`` if malformed
    (format: :mod:`tangram_celery.managers.basic`)."""
    from tangram_celery.managers.basic import parse_api_limits

    return list(parse_api_limits(api_limits))


def signature_of(action: Action, key: str | None = None) -> Signature:
    """The duration model's key of an action: its kind and the submitter's signature (or
    ``key`` in its place, e.g. a GPU pool's fallback to the reward model's name)."""
    return (action.kind, action.signature if key is None else key)


def request_for(
    action: Action,
    arrived: float,
    model: DurationModel | None = None,
    allowed: Sequence[int] | None = None,
    key: str | None = None,
) -> Request:
    """The admission request of an action: allowed unit counts with expected durations.

    An action without elasticity may only get its minimum. Durations come from its own T1 and
    E(m) when given, else from the online model once it knows the action's signature, else
    they are unknown (the scheduler then admits the action at its minimum). ``allowed`` narrows
    the unit counts to those the pool can serve (default: the cost vector's, ascending);
    ``key`` replaces the signature in the model's key (see :func:`signature_of`).
    """
    allowed = action.units().allowed_units() if allowed is None else tuple(allowed)
    if action.elasticity is None:
        allowed = allowed[:1]
    signature = signature_of(action, key)
    if action.t1 is not None:
        options = tuple((m, action.expected_duration(m)) for m in allowed)
    elif model is not None and signature[1] and model.known(signature):
        options = model.options(signature, allowed)
    else:
        options = tuple((m, None) for m in allowed)
    return Request(action.id, options, arrived, action.signature)


def exec_spec(
    action: Action, units: tuple[int, ...], cpus: tuple[int, ...], default_timeout_s: float
) -> ExecSpec:
    """Turn a CPU action into the sandbox's exec spec: ``len(units)`` is the parallelism handed
    to the command, ``cpus`` the host CPUs it is pinned to."""
    payload = action.payload
    files = dict(payload.get("files", {}))
    if "code" in payload:
        snippet = f".tangram-{action.id}.py"
        files[snippet] = str(payload["code"])
        command = f"{SANDBOX_PYTHON} {snippet}; s=$?; rm -f {snippet}; exit $s"
    else:
        command = rewrite_parallelism(str(payload["cmd"]), len(units))
    return ExecSpec(
        trajectory_id=action.trajectory_id,
        command=command,
        files=files,
        timeout_s=action.timeout_s or default_timeout_s,
        cores=cpus,
        env={**payload.get("env", {}), "TANGRAM_UNITS": str(len(units))},
        stdin=payload.get("stdin"),
    )


def outcome_status(outcome: ExecOutcome) -> str:
    """``ok``, ``failed`` (non-zero exit or signal) or ``timeout``."""
    if outcome.timed_out:
        return "timeout"
    return "ok" if outcome.exit_code == 0 else "failed"


def outcome_output(outcome: ExecOutcome) -> dict[str, Any]:
    """The JSON output of a sandboxed command."""
    return {
        "exit_code": outcome.exit_code,
        "signal": outcome.signal,
        "timed_out": outcome.timed_out,
        "oom_killed": outcome.oom_killed,
        "stdout": outcome.stdout,
        "stderr": outcome.stderr,
        "stdout_truncated": outcome.stdout_truncated,
        "stderr_truncated": outcome.stderr_truncated,
        "environment_replaced": outcome.environment_replaced,
        "replaced_reason": outcome.replaced_reason,
    }


def scheduler_job(request: Request) -> Job:
    """The scheduler's view of an admission request (elastic when it has several counts, all
    with known durations)."""
    known = all(d is not None for _, d in request.options)
    return Job(request.id, "cpu", request.options, request.arrived,
               elastic=known and len(request.options) > 1)


@dataclass
class Held:
    """An allocation from the gate as the node sees it: the trajectory, its unit ids and the
    host CPUs it runs on now, when it is expected to end (moved by its loans), whether it may
    lend, the units it lends now (borrower -> units), whether its action has ended (it then
    holds its units until its loans end), whether it ever lent (its duration then says little
    about its speed) and its closed loans (for the audit trail)."""

    trajectory_id: str
    units: tuple[int, ...]
    pinned: tuple[int, ...]
    expected_end: float | None
    lends: bool
    lent: dict[str, tuple[int, ...]] = field(default_factory=dict)
    ended: bool = False
    lent_ever: bool = False
    loans: list[dict[str, Any]] = field(default_factory=list)

    def holder(self, action_id: str) -> Holder:
        """The loan plan's view."""
        lent = tuple(u for units in self.lent.values() for u in units)
        return Holder(action_id, self.units, self.expected_end, lent,
                      self.lends and not self.ended)

    def kept(self) -> tuple[int, ...]:
        """The units it holds and has not lent."""
        lent = {u for units in self.lent.values() for u in units}
        return tuple(u for u in self.units if u not in lent)


@dataclass
class Bridge:
    """A borrower: its loan (None once over), the trajectory and host CPUs it runs on, when
    the loan began, its own units once the gate admits it, and whether its run has ended."""

    loan: Loan | None
    trajectory_id: str
    pinned: tuple[int, ...]
    since: float
    own: tuple[int, ...] | None = None
    ended: bool = False


Repin = Callable[[str, tuple[int, ...], tuple[int, ...]], bool]
"""A sandbox backend's ``repin(trajectory_id, cores, new_cores)``."""


class CoreLoans:
    """The loans of one node (thread-safe): who holds what, who waits, who borrows.

    `physical` maps unit ids to host CPUs; `repin` moves a running action's sandbox; the
    methods return the action ids whose allocation the caller must now release through the
    gate (a lender whose last loan ended after its action did, a borrower's late grant)."""

    def __init__(self, config: LoanConfig, repin: Repin | None,
                 physical: Callable[[Sequence[int]], tuple[int, ...]]) -> None:
        self.config = config
        self.repin = repin if config.enabled else None
        self.physical = physical
        self.lock = threading.Lock()
        self.held: dict[str, Held] = {}
        self.waiting: dict[str, Job] = {}
        self.bridges: dict[str, Bridge] = {}

    def may_borrow(self, job: Job) -> bool:
        """Whether `job` (short, waiting) could borrow now."""
        if self.repin is None or job_class(job, self.config.short_s) != "short":
            return False
        with self.lock:
            return bool(self._plan(job, set()))

    def hold(self, action_id: str, trajectory_id: str, request: Request,
             units: tuple[int, ...], lends: bool) -> None:
        """An allocation from the gate (a possible lender if `lends`)."""
        expected = dict(request.options).get(len(units))
        with self.lock:
            self.held[action_id] = Held(trajectory_id, units, self.physical(units),
                                        None if expected is None else time.time() + expected,
                                        lends)

    def borrow(self, job: Job, trajectory_id: str) -> Loan | None:
        """A loan for `job` (its request then waits in the gate without it): the lender's
        cpuset shrinks to the cores it keeps. A lender whose sandbox cannot be re-pinned (not
        started yet, or just ended) is passed over."""
        assert self.repin is not None
        refused: set[str] = set()
        with self.lock:
            while loans := self._plan(job, refused):
                loan = loans[0]
                lender = self.held[loan.lender]
                kept = self.physical([u for u in lender.kept() if u not in loan.units])
                if not self.repin(lender.trajectory_id, lender.pinned, kept):
                    refused.add(loan.lender)
                    continue
                now = time.time()
                self._retime(lender, now, len(loan.units))
                lender.pinned = kept
                lender.lent[job.job_id] = loan.units
                lender.lent_ever = True
                self.bridges[job.job_id] = Bridge(loan, trajectory_id,
                                                  self.physical(loan.units), now)
                return loan
        return None

    def admitted(self, action_id: str, request: Request, units: tuple[int, ...]
                 ) -> tuple[list[str], dict[str, Any] | None]:
        """The gate admitted a borrower's request: it moves onto `units` and its loan ends;
        if its run has ended already, its grant is to be released at once. Returns the
        allocations to release and the closed loan's audit entry."""
        assert self.repin is not None
        with self.lock:
            bridge = self.bridges[action_id]
            if bridge.ended:
                del self.bridges[action_id]
                return [action_id], None
            pinned = self.physical(units)
            moved = self.repin(bridge.trajectory_id, bridge.pinned, pinned)
            expected = dict(request.options).get(len(units))
            self.held[action_id] = Held(bridge.trajectory_id, units,
                                        pinned if moved else bridge.pinned,
                                        None if expected is None else time.time() + expected,
                                        False)
            bridge.own = units
            if not moved:  # its sandbox is not running yet: it stays on the lent core
                return [], None
            bridge.pinned = pinned
            return self._end_loan(action_id, bridge)

    def ended(self, action_id: str) -> tuple[list[str], dict[str, Any] | None]:
        """A borrower's run ended: its loan (if any) ends; returns the allocations to release
        (its own, once admitted) and the closed loan's audit entry."""
        with self.lock:
            bridge = self.bridges[action_id]
            bridge.ended = True
            release, entry = self._end_loan(action_id, bridge)
            if bridge.own is not None:
                del self.bridges[action_id]
                release.append(action_id)
            return release, entry

    def close(self, action_id: str) -> dict[str, Any] | None:
        """An allocation's action ended: None if it lends (it is released when its last
        loan ends), else its audit extras (the loans it made)."""
        with self.lock:
            held = self.held.get(action_id)
            if held is not None and held.lent:
                held.ended = True
                return None
            self.held.pop(action_id, None)
            return {"lent": held.loans} if held is not None and held.loans else {}

    def lent_ever(self, action_id: str) -> bool:
        """Whether the action's allocation ever lent a core."""
        with self.lock:
            held = self.held.get(action_id)
            return held is not None and held.lent_ever

    def _plan(self, job: Job, refused: set[str]) -> tuple[Loan, ...]:
        """The loan `job` would get now from a lender not in `refused` (lock held)."""
        holders = [held.holder(action_id) for action_id, held in self.held.items()
                   if action_id not in refused]
        waiting = [*self.waiting.values(), job] if job.job_id not in self.waiting else \
            list(self.waiting.values())
        return plan_loans(waiting, holders, time.time(), self.config, {job.job_id})

    def _end_loan(self, borrower: str, bridge: Bridge) -> tuple[list[str], dict[str, Any] | None]:
        """Give a borrower's lent units back to its lender (lock held)."""
        loan, bridge.loan = bridge.loan, None
        if loan is None:
            return [], None
        now = time.time()
        entry = {"action_id": borrower, "units": list(loan.units), "start": bridge.since,
                 "end": now, "lent_by": loan.lender}
        lender = self.held[loan.lender]
        self._retime(lender, now, -len(loan.units))
        del lender.lent[borrower]
        lender.loans.append({k: v for k, v in entry.items() if k != "lent_by"})
        if lender.ended:
            return ([loan.lender] if not lender.lent else []), entry
        kept = self.physical(lender.kept())
        assert self.repin is not None
        if self.repin(lender.trajectory_id, lender.pinned, kept):
            lender.pinned = kept
        return [], entry

    @staticmethod
    def _retime(lender: Held, now: float, more: int) -> None:
        """A lender lends `more` units (fewer if negative): its expected end moves."""
        lent = sum(map(len, lender.lent.values()))
        lender.expected_end = slowed(lender.expected_end, now, len(lender.units), lent,
                                     lent + more)


class CpuNode:
    """One CPU node: its cores, its sandboxes, its admission gate and its Redis registration.

    ``loans``: the loan settings (default: on with the robust scheduler, where the sandbox
    backend can re-pin running actions; see the module docstring)."""

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
    ) -> None:
        self.settings = settings
        self.name = name
        self.memory_mb = memory_mb
        self.sandbox = sandbox
        self.registry = registry
        self.admission = Admission(range(cores), policy)
        self.cpus = tuple(cpus)
        self.model = model or DurationModel()
        self._limits = action_limits(settings)
        repin = getattr(sandbox, "repin", None)
        config = loans or loan_config(RobustConfig(loans=settings.scheduler == "robust"))
        self.loans = CoreLoans(config, repin if callable(repin) else None, self.physical)
        self._heartbeat = Heartbeat(f"tangram-heartbeat-{name}", settings.node_heartbeat_s,
                                    self._beat)

    def start(self) -> None:
        """Register the node and start its heartbeat."""
        if self.registry is None:
            return
        self.registry.register_node(self.name, self.admission.total, self.memory_mb)
        self._heartbeat.start()

    def stop(self) -> None:
        """Deregister, stop the heartbeat and remove every sandbox of this node."""
        self._heartbeat.stop()
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
                              node=self.name, timings=timings)
        request = request_for(action, received, self.model)
        cores, borrowed = self._admit(action, request)
        timings.admitted = time.time()
        timings.sched_s = self.admission.decision_s(action.id)
        result.units = cores
        try:
            spec = exec_spec(action, cores, self.physical(cores), self.settings.default_timeout_s)
            outcome = self.sandbox.run(spec)
        except (SandboxError, ValidationError) as exc:
            result.error = str(exc)
            timings.exec_started = timings.exec_finished = time.time()
        else:
            result.status = outcome_status(outcome)
            result.output = outcome_output(outcome)
            timings.exec_started, timings.exec_finished = outcome.started_at, outcome.finished_at
            timings.exec_s, timings.setup_s = outcome.exec_s, outcome.setup_s
            if action.signature and not outcome.timed_out \
                    and not self.loans.lent_ever(action.id):
                self.model.observe(signature_of(action), len(cores), outcome.exec_s)
        finally:
            if borrowed:
                self._settle(*self.loans.ended(action.id))
            else:
                self._close_allocation(action.id)
        timings.stored = time.time()
        return result

    def _admit(self, action: Action, request: Request) -> tuple[tuple[int, ...], bool]:
        """Cores from the gate, or, for a short action the gate does not admit at once, a lent
        core while its request waits in the gate (see the module docstring); waits in the
        gate when no core can be lent. Returns the cores and whether they are lent."""
        job = scheduler_job(request)
        short = job_class(job, self.loans.config.short_s) == "short"
        with self.loans.lock:
            self.loans.waiting[action.id] = job
        try:
            if self.loans.may_borrow(job):
                try:
                    cores = self.admission.acquire(request, timeout=0)
                except TimeoutError:
                    loan = self.loans.borrow(job, action.trajectory_id)
                    if loan is not None:
                        threading.Thread(target=self._await_own, args=(action.id, request),
                                         name=f"tangram-loan-{action.id}", daemon=True).start()
                        return loan.units, True
                else:
                    self.loans.hold(action.id, action.trajectory_id, request, cores, not short)
                    return cores, False
            cores = self.admission.acquire(request)
        finally:
            with self.loans.lock:
                self.loans.waiting.pop(action.id, None)
        self.loans.hold(action.id, action.trajectory_id, request, cores, not short)
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
        if self.registry is not None:
            self.registry.heartbeat(self.name, self.admission.free_count(),
                                    (self.admission.policy_calls, self.admission.policy_s))
