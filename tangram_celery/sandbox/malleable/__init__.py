"""Malleable test runs: a pytest run whose worker processes can be added and retired while it runs.

The controller (a pytest session started with ``-p tangram_celery.sandbox.malleable.plugin
--malleable=N``) does not collect; its workers do, each a whole pytest session with its own
session-scoped fixtures, as under pytest-xdist. The first worker's collection fills one queue of
test ids; workers pull ids from it over a Unix socket (JSON lines, :mod:`.protocol`) and send every
report back, which the controller replays into its own session, so the failures, the summary line
and the exit status are pytest's own. ``grow`` starts a worker, ``shrink`` retires one after its
current test, each sent by :func:`~.control.resize` to the run's control socket, whose answer is
where the node grows or shrinks the action's cpuset; :class:`~.resizer.CoreResizer` does both
together for a sandboxed action, and :func:`~.shipping.runner_files` gives the runner to an
action whose Python lacks this package. :func:`~.command.malleable_command` turns the
pytest invocations of an action's command into malleable runs and leaves any other command alone.

Part of the sandbox layer: it imports the ground floor and the sandbox's output module only.
"""

from __future__ import annotations

from tangram_celery.sandbox.malleable.command import is_pytest_command, malleable_command
from tangram_celery.sandbox.malleable.control import resize
from tangram_celery.sandbox.malleable.pool import PLUGIN
from tangram_celery.sandbox.malleable.resizer import CoreResizer
from tangram_celery.sandbox.malleable.shipping import runner_files

__all__ = ["PLUGIN", "CoreResizer", "is_pytest_command", "malleable_command", "resize",
           "runner_files"]
