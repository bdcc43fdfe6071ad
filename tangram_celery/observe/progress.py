"""A small ``rich`` progress bar for batches of actions (on stderr, so stdout stays clean)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)


@contextlib.contextmanager
def result_progress(
    total: int, description: str = "actions", console: Console | None = None
) -> Iterator[Callable[[], None]]:
    """Show a bar of ``total`` steps; yields a thread-safe ``advance()`` for one step."""
    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=console or Console(stderr=True),
    )
    with progress:
        task = progress.add_task(description, total=total)
        yield lambda: progress.advance(task)
