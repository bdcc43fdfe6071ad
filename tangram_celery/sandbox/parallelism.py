"""The ``pytest -n`` rewrite: elastic commands learn how many units they were given."""

from __future__ import annotations

import re
from collections.abc import Iterator

_CMD_START = r"(?:^|(?<=[;&|(\n]))"
_ASSIGNMENTS = r"(?:\s*[A-Za-z_][A-Za-z0-9_]*=\S*)*"
_PYTEST = (
    r"(?:\S*/)?python(?:3(?:\.\d+)?)?\s+-m\s+pytest"
    r"|(?:\S*/)?py\.?test"
)
_INVOCATION_RE = re.compile(
    _CMD_START + r"(?P<head>" + _ASSIGNMENTS + r"\s*(?:" + _PYTEST + r"))(?=$|[\s;&|)])"
)
_SIMPLE_END_RE = re.compile(r"[;&|)\n]")


def _has_explicit_workers(args: str) -> bool:
    """Whether pytest arguments already choose the worker count (``-n``, ``--malleable``) or
    disable xdist."""
    for token in args.split():
        if token == "-n" or token.startswith("--numprocesses") or token == "no:xdist":  # nosec B105 # pytest arguments, not passwords
            return True
        if token.startswith("--malleable="):
            return True
        if token.startswith("-n") and (token[2:3].isdigit() or token[2:3] in ("a", "l", "=")):
            return True
        if token == "-pno:xdist":  # nosec B105 # a pytest argument, not a password
            return True
    return False


def pytest_invocations(command: str) -> Iterator[tuple[int, str]]:
    """Each ``pytest`` invocation at a command position in ``command``: where its arguments start
    (just after ``pytest``) and the arguments up to the end of that simple command."""
    for match in _INVOCATION_RE.finditer(command):
        end = match.end("head")
        tail_end = _SIMPLE_END_RE.search(command, end)
        yield end, command[end: tail_end.start() if tail_end else len(command)]


def chooses_workers(args: str) -> bool:
    """Whether pytest arguments already choose the worker count or disable xdist."""
    return _has_explicit_workers(args)


def rewrite_parallelism(command: str, units: int) -> str:
    """Tell elastic commands their parallelism: ``pytest ...`` becomes ``pytest -n <units> ...``.

    Rewrites every ``pytest`` / ``py.test`` / ``python[3[.x]] -m pytest`` invocation at a command
    position (start, or after ``;``, ``&``, ``|``, ``(`` or a newline; leading ``VAR=value``
    assignments allowed). Invocations that already pass ``-n``/``--numprocesses``, are malleable
    runs (``--malleable=N``) or disable xdist (``-p no:xdist``) are left alone, and so is
    everything when ``units`` is 1. Pure function.
    """
    if units < 1:
        raise ValueError(f"units must be >= 1, got {units}")
    if units == 1:
        return command
    out: list[str] = []
    pos = 0
    for end, args in pytest_invocations(command):
        out.append(command[pos:end])
        if not _has_explicit_workers(args):
            out.append(f" -n {units}")
        pos = end
    out.append(command[pos:])
    return "".join(out)
