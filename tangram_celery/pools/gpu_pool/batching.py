"""The GPU pool's service batching: the running batch an action joins, and who joins a new one.

Reward actions waiting for the same service are sent together (see
:mod:`tangram_celery.pools.gpu_pool`); these pure rules keep each service's FCFS order and bound a
batch's joiners.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tangram_celery.managers.gpu import Chunk

DEFAULT_MAX_BATCH = 16


@dataclass(frozen=True)
class Batch:
    """A service running on a chunk (unit ids): its model, the action that was granted the
    chunk, how many actions joined it so far and how many members still run."""

    model: str
    units: Chunk
    owner: str
    joiners: int = 0
    holders: int = 1


def join_target(
    model: str, sizes: Sequence[int], batches: Sequence[Batch], waiting_models: Iterable[str],
    max_batch: int,
) -> Batch | None:
    """The running batch an arriving action of ``model`` (allowed chunk sizes ``sizes``) joins,
    or None (it waits in the gate): one of ``model`` on a chunk of an allowed size with fewer
    than ``max_batch`` joiners so far, the least joined first; never while an (older) action
    of ``model`` is waiting (``waiting_models``), so a service's actions keep FCFS order."""
    if max_batch < 1 or model in set(waiting_models):
        return None
    open_batches = [b for b in batches
                    if b.model == model and len(b.units) in sizes and b.joiners < max_batch]
    if not open_batches:
        return None
    return min(open_batches, key=lambda b: (b.joiners, b.units))


Waiter = tuple[str, str, Sequence[int]]
"""An action waiting in the gate: its id, model and allowed chunk sizes."""


def gate_joiners(model: str, size: int, waiting: Sequence[Waiter], max_batch: int) -> list[str]:
    """The waiting actions (oldest first) that join a batch of ``model`` just granted a
    ``size``-unit chunk: those of ``model``, in order, at most ``max_batch``, stopping at the
    first of ``model`` that does not allow ``size`` (nothing overtakes it: FCFS per service)."""
    chosen: list[str] = []
    for action_id, waiting_model, sizes in waiting:
        if len(chosen) >= max_batch:
            break
        if waiting_model != model:
            continue
        if size not in sizes:
            break
        chosen.append(action_id)
    return chosen
