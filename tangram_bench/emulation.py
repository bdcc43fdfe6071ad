"""Actions whose run time emulates an elastic workload honestly on a small machine.

An emulated test run sleeps ``T1 / S(m)`` where ``m`` is the number of units the scheduler
really gave it (read from ``TANGRAM_UNITS`` inside the sandbox) and ``S(m)`` is Amdahl's
speed-up for parallel fraction ``p``. The units are real scheduler allocations (exclusive,
audited); only the work inside is a sleep, so a 2-core machine can stand in for a larger node.
"""

from __future__ import annotations

from typing import Any

from tangram_celery.action import Action
from tangram_celery.client import command_action, test_run_action

SLEEP_BY_UNITS = (
    "/usr/bin/python3 -c \"import os, time; m = int(os.environ['TANGRAM_UNITS']); "
    "time.sleep({t1} / (1.0 / ((1.0 - {p}) + {p} / m)))\""
)


def amdahl_duration(t1: float, p: float, units: int) -> float:
    """T1 / S(m) with Amdahl's speed-up ``S(m) = 1 / ((1 - p) + p / m)``."""
    return t1 * ((1.0 - p) + p / units)


def emulated_test_run(
    trajectory_id: str, t1: float, p: float, max_units: int, *, declare: bool = True,
    signature: str = "emulated-tests", min_units: int = 1,
) -> Action:
    """An elastic test-run action over ``min_units..max_units`` cores lasting ``T1 / S(m)``.

    With ``declare`` the action states its T1 and elasticity (profiled); without, the node's
    online duration model has to learn them from the signature. ``min_units == max_units``
    pins the action to one fixed DoP (the fixed-DoP baseline).
    """
    fields: dict[str, object] = {"signature": signature}
    if declare:
        fields |= {"t1": t1, "elasticity": {"amdahl": p}}
    else:
        fields |= {"elasticity": {"amdahl": p}}
    return test_run_action(trajectory_id, SLEEP_BY_UNITS.format(t1=t1, p=p),
                           cpu=(min_units, max_units), **fields)


def emulated_exec(trajectory_id: str, seconds: float, *, declare: bool = True) -> Action:
    """A short inelastic exec action lasting ``seconds`` on one core; with ``declare`` it
    states that duration (an oracle), else the node learns it from the signature."""
    declared: dict[str, Any] = {"t1": max(seconds, 1e-3)} if declare else {}
    return command_action(trajectory_id, f"sleep {seconds:.3f}", signature="emulated-exec",
                          **declared)
