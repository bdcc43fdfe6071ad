"""Actions whose run time emulates an elastic workload honestly on a small machine.

An emulated test run sleeps ``T1 / S(m)`` where ``m`` is the number of units the scheduler
really gave it (read from ``TANGRAM_UNITS`` inside the sandbox) and ``S(m)`` is Amdahl's
speed-up for parallel fraction ``p``. The units are real scheduler allocations (exclusive,
audited); only the work inside is a sleep, so a 2-core machine can stand in for a larger node.

A *malleable* emulated test run (:func:`emulated_malleable_run`) is a real pytest run through
the malleable runner instead: a generated suite whose first test sleeps the serial part
``(1 - p) * T1`` and whose other tests each sleep an equal share of ``p * T1`` once the serial
part is done, so its progress follows the workers it has at each moment, and a worker's start
and collection are paid for real.
"""

from __future__ import annotations

import uuid
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


MALLEABLE_TESTS_PER_CORE = 2
"""Parallel tests of a malleable emulated run per core it may have (its grain)."""
MALLEABLE_SUITE = """\
import pathlib, time
import pytest

DONE = pathlib.Path(__file__).with_name("serial-done")


def test_0_serial():
    time.sleep({serial})
    DONE.touch()


@pytest.mark.parametrize("share", range({tests}))
def test_parallel(share):
    deadline = time.monotonic() + 3600
    while not DONE.exists():
        assert time.monotonic() < deadline, "the serial part never ended"
        time.sleep(0.005)
    time.sleep({share})
"""


def malleable_suite(t1: float, p: float, tests: int) -> str:
    """A pytest module of ``1 + tests`` tests whose single-core work is ``t1``: the first sleeps
    the serial part ``(1 - p) * t1``, each other one waits for it and sleeps ``p * t1 / tests``
    (Amdahl's speed-up, on whatever number of workers runs it). Every test passes."""
    if tests < 1:
        raise ValueError(f"a malleable suite needs at least one parallel test, got {tests}")
    return MALLEABLE_SUITE.format(serial=round((1.0 - p) * t1, 6), tests=tests,
                                  share=round(p * t1 / tests, 6))


def emulated_malleable_run(
    trajectory_id: str, t1: float, p: float, max_units: int, *,
    signature: str = "emulated-tests",
) -> Action:
    """A malleable test run over ``1..max_units`` cores: the suite of :func:`malleable_suite`
    (:data:`MALLEABLE_TESTS_PER_CORE` parallel tests per core) as a payload file in a directory
    of its own, run by pytest through the malleable runner (``"malleable": true``), so a node
    that resizes runs can change its workers while it runs. It declares no duration."""
    folder = f"emulated-{uuid.uuid4().hex[:12]}"
    suite = malleable_suite(t1, p, MALLEABLE_TESTS_PER_CORE * max_units)
    return test_run_action(
        trajectory_id, f"python3 -m pytest -q -p no:cacheprovider {folder}",
        cpu=(1, max_units), elasticity={"amdahl": p}, signature=signature,
        payload={"malleable": True, "files": {f"{folder}/test_emulated.py": suite}})
