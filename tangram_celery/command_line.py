"""How every command-line entry point ends: its exit code, or one line naming the problem.

A :class:`~tangram_celery.errors.TangramError` (a bad setting, an unreachable service, a refused
request) is what a user can act on: it ends the command with exit status 2 and
``<prog>: error: <message>`` on stderr, as argparse reports a bad argument. Anything else is a
bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from tangram_celery.errors import TangramError
from tangram_celery.settings import Settings

USAGE_ERROR = 2


def run_command(prog: str, command: Callable[[], int | None]) -> int:
    """Run ``command``: its exit status (0 when it returns None), or :data:`USAGE_ERROR` after
    printing ``prog: error: ...`` when it raises a :class:`TangramError`."""
    try:
        return command() or 0
    except TangramError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return USAGE_ERROR


def run_with_settings(
    parser: argparse.ArgumentParser,
    run: Callable[[Settings, argparse.Namespace], int | None],
    argv: Sequence[str] | None = None,
) -> int:
    """Parse ``argv`` with ``parser``, read :class:`Settings` from the environment and call
    ``run(settings, args)``, ending as :func:`run_command` does."""
    args = parser.parse_args(argv)
    return run_command(parser.prog, lambda: run(Settings.from_env(), args))
