"""The worker processes of a malleable test run: how one starts, what the controller knows of it."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

from tangram_celery.sandbox.malleable.protocol import Channel
from tangram_celery.sandbox.output import CappedBuffer

PLUGIN = "tangram_celery.sandbox.malleable.plugin"
"""The module pytest loads (``-p``) in the controller and in every worker."""

State = Literal["starting", "running", "retiring", "drained", "gone"]
"""``starting``: not collected yet; ``running``: takes tests; ``retiring``: told to leave after
its current test; ``drained``: the queue was empty when it asked, it ends after its current test;
``gone``: exited."""

STDERR_KEPT = 4096
"""How much of a worker's stderr (its head and tail) a crash report shows."""


@dataclass
class Worker:
    """One worker process and what it holds."""

    index: int
    proc: subprocess.Popen[bytes]
    stderr_path: Path
    started: float
    state: State = "starting"
    channel: Channel | None = None
    held: list[str] = field(default_factory=list)
    running: str | None = None
    location: tuple[str, int | None, str] | None = None
    collected: float | None = None
    ended: float | None = None
    tests: int = 0
    last_done: float | None = None
    closed: bool = False

    @property
    def pid(self) -> int:
        """The worker's process id."""
        return self.proc.pid

    @property
    def active(self) -> bool:
        """Whether it counts towards the run's worker count (it will take more tests)."""
        return self.state in ("starting", "running")

    def stderr_text(self) -> str:
        """The head and tail of what it wrote to stderr."""
        buffer = CappedBuffer(STDERR_KEPT)
        try:
            with self.stderr_path.open("rb") as stream:
                while chunk := stream.read(65536):
                    buffer.feed(chunk, 0.0)
        except OSError:
            return ""
        return buffer.text()


def worker_argv(address: str, args: list[str]) -> list[str]:
    """The command line of a worker connecting to ``address`` and running pytest with ``args``."""
    return [sys.executable, "-m", "pytest", "-p", PLUGIN, f"--malleable-connect={address}", *args]


def spawn(index: int, address: str, args: list[str], cwd: Path, scratch: Path) -> Worker:
    """Start worker ``index``: its stdout is dropped, its stderr kept in ``scratch``."""
    stderr_path = scratch / f"worker-{index}.stderr"
    stream: IO[bytes]
    with stderr_path.open("wb") as stream:
        proc = subprocess.Popen(  # nosec B603 # this interpreter running pytest, no shell
            worker_argv(address, args), cwd=cwd, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=stream)
    return Worker(index=index, proc=proc, stderr_path=stderr_path, started=time.monotonic())


OWN_OPTIONS = ("--malleable", "--malleable-control", "--malleable-stats", "--malleable-connect")
"""The runner's options, which a worker's command line leaves out (it gets its own)."""


def worker_args(args: list[str] | tuple[str, ...]) -> list[str]:
    """The controller's pytest arguments without the runner's own options and ``-p`` of it."""
    out: list[str] = []
    skip = False
    for index, arg in enumerate(args):
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in OWN_OPTIONS:
            skip = "=" not in arg
            continue
        if arg == "-p" and index + 1 < len(args) and args[index + 1] == PLUGIN:
            skip = True
            continue
        if arg == f"-p{PLUGIN}":
            continue
        out.append(arg)
    return out
