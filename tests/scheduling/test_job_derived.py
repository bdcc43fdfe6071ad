"""A `Job`'s derived flags are set on construction, with the values their definitions give."""

from __future__ import annotations

import pytest

from tangram_celery.scheduling import Job
from tangram_celery.scheduling.types import Option

CASES: list[tuple[tuple[Option, ...], bool, bool, bool]] = [
    (((1, 2.0),), True, False, True),
    (((1, 2.0), (2, 1.2)), True, True, True),
    (((1, 2.0), (2, None)), True, False, True),
    (((1, 2.0), (2, 1.2), (4, 0.8)), True, True, False),
    (((2, 2.0), (3, 1.5), (4, 1.2)), False, False, True),
]


@pytest.mark.parametrize(("options", "elastic", "is_elastic", "runs"), CASES)
def test_flags_are_set_on_construction(options: tuple[Option, ...], elastic: bool,
                                       is_elastic: bool, runs: bool) -> None:
    job = Job("j", "cpu", options, 0.0, elastic=elastic)
    assert {"is_elastic", "runs"} <= set(vars(job))
    assert (job.is_elastic, job.runs) == (is_elastic, runs)
    assert job == Job("j", "cpu", options, 0.0, elastic=elastic)
