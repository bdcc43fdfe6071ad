"""The in-worker actuator: Celery's own autoscaler hook, sized by the autoscaling policy."""

from __future__ import annotations

from collections.abc import Sequence

from celery.worker.autoscale import Autoscaler

from tangram_celery.autoscale.policy import Budget, PoolLimits, PoolLoad, ScalingConfig, decide
from tangram_celery.autoscale.work import Work, action_work


class ActAwareAutoscaler(Autoscaler):  # type: ignore[misc]
    """A custom Celery autoscaler sizing a prefork pool by predicted work, not message count.

    Use it with both ``worker_autoscaler =
    "tangram_celery.autoscale.actuators:ActAwareAutoscaler"`` and ``--autoscale=max,min``
    (the setting alone does nothing), and only with the prefork pool (``-P threads`` crashes at
    start). Celery calls :attr:`qty` on every task message and every ``keepalive`` seconds; here
    it is the :func:`~tangram_celery.autoscale.policy.decide` target for a one-process-per-unit
    pool whose running actions are the active requests and whose queued work is the expected
    duration of the reserved (prefetched) ones. ``tangram_autoscale_target_wait_s`` in the app's
    configuration sets the target wait (default 2 s). Celery's own ``keepalive`` still delays
    every shrink. The node scheduler still decides core allocations; this only sizes the pool.
    """

    @property
    def qty(self) -> int:
        """Processes wanted now."""
        from celery.worker import state

        reserved = list(state.reserved_requests)
        active = len(state.active_requests)
        work = [action_work(request.args[0] if request.args else None) for request in reserved
                if request not in state.active_requests]
        return worker_target(self.processes, active, work, self.min_concurrency,
                             self.max_concurrency, self._target_wait_s())

    def _target_wait_s(self) -> float:
        conf = getattr(getattr(self.worker, "app", None), "conf", None)
        value = conf.get("tangram_autoscale_target_wait_s") if conf is not None else None
        return float(value) if value else ScalingConfig().target_wait_s


def worker_target(processes: int, active: int, queued: Sequence[Work], minimum: int,
                  maximum: int, target_wait_s: float) -> int:
    """The pure core of :class:`ActAwareAutoscaler`: the policy's target for one worker pool."""
    load = PoolLoad(
        pool="worker", resource="process", member_units=1, size=processes, running=active,
        prefetched=len(queued), running_units=active,
        predicted_work_s=sum(w.seconds for w in queued), unknown=sum(w.unknown for w in queued),
    )
    limits = {"worker": PoolLimits(minimum, maximum)}
    config = ScalingConfig(target_wait_s=target_wait_s, down_hold_s=0.0)
    return decide([load], Budget({}, limits), config).targets[0].target
