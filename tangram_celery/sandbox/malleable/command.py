"""Which commands become malleable test runs, and how: pytest invocations only."""

from __future__ import annotations

import shlex

from tangram_celery.sandbox.malleable.pool import PLUGIN
from tangram_celery.sandbox.parallelism import chooses_workers, pytest_invocations


def is_pytest_command(command: str) -> bool:
    """Whether ``command`` runs pytest at a command position (a malleable run is possible)."""
    return any(True for _ in pytest_invocations(command))


def malleable_command(command: str, workers: int, control: str | None = None) -> str:
    """``command`` with each pytest invocation made a malleable run of ``workers`` workers
    (listening at ``control`` when given); an invocation that already chooses its workers
    (``-n``, ``-p no:xdist``) and any command that is not pytest stay as they are. Pure."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    extra = f" -p {PLUGIN} --malleable={workers}"
    if control is not None:
        extra += f" --malleable-control={shlex.quote(control)}"
    out: list[str] = []
    pos = 0
    for end, args in pytest_invocations(command):
        out.append(command[pos:end])
        if not chooses_workers(args):
            out.append(extra)
        pos = end
    out.append(command[pos:])
    return "".join(out)
