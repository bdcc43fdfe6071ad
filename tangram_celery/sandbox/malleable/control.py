"""The node's side of a malleable run: resize events, and asking a running run to grow or shrink
(``python -m tangram_celery.sandbox.malleable.control SOCKET grow|shrink|status``)."""

from __future__ import annotations

import json
import sys
from typing import Any

from tangram_celery.sandbox.malleable.protocol import connect

OPERATIONS = ("grow", "shrink", "status")


def resize(address: str, operation: str, timeout: float = 10.0) -> dict[str, Any]:
    """Send ``grow``, ``shrink`` or ``status`` to the run listening at ``address``; its answer
    (``ok``, ``workers``, ``tests``, ``done``, ``queued``, ``pids``; ``retiring`` on a shrink)
    comes back once the controller acted. This is the node's hook: it grows the action's cpuset
    before it sends ``grow`` and shrinks it as soon as ``shrink`` is answered, while the retiring
    worker finishes its current test on the cores left."""
    if operation not in OPERATIONS:
        raise ValueError(f"unknown operation {operation!r}; choose one of {list(OPERATIONS)}")
    channel = connect(address, timeout)
    try:
        return channel.request({"op": operation})
    finally:
        channel.close()


def main(argv: list[str] | None = None) -> int:
    """Command line: the answer as JSON on stdout; exit status 1 when the run refused."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[1] not in OPERATIONS:
        print(f"usage: python -m {__name__} SOCKET {'|'.join(OPERATIONS)}", file=sys.stderr)
        return 2
    answer = resize(args[0], args[1])
    print(json.dumps(answer))
    return 0 if answer.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
