"""The GPU pool's side of Triton: its reward backend, retries while Triton is away, restore times.

What the pool needs of its reward executor (:class:`RewardBackend`), the check that no model's
output clashes with a field the pool adds, the backoff while Triton is unavailable and the error
once it stayed away too long, and the restore-time estimates and residency view that the
service-aware scheduler reads.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from tangram_celery.errors import ConfigError, TritonUnavailable
from tangram_celery.managers.gpu import Chunk
from tangram_celery.pools.placement import Residency
from tangram_celery.scheduling.residency import Resident, service_name
from tangram_celery.scheduling.types import Service

if TYPE_CHECKING:
    from tangram_celery.reward.executor import RewardOutcome
    from tangram_celery.reward.repository import ModelSpec

RESERVED_OUTPUTS = frozenset(
    {"model", "service", "loaded", "evicted", "joined", "gpu_wait_s", "simulated_gpus"}
)
DEFAULT_TRITON_RETRY_S = 30.0
RETRY_FIRST_S = 0.2
RETRY_MAX_S = 2.0


class RewardBackend(Protocol):
    """What the pool needs from its reward executor (:class:`RewardExecutor` in production)."""

    def models(self) -> list[str]:
        """The reward models it can run."""

    def spec(self, model: str) -> ModelSpec:
        """The config-derived spec of ``model``; :class:`ValidationError` if unknown."""

    def ready(self) -> bool:
        """Whether the inference server answers."""

    def residents(self) -> list[tuple[str, Chunk]]:
        """(model, GPU ids) of every resident service."""

    def loaded(self) -> list[Resident]:
        """Every resident service with its memory and last use (chunks of GPU ids)."""

    def rank_chunks(self, model: str, chunks: Sequence[Chunk]) -> list[Chunk]:
        """Candidate chunks (GPU ids) best first for ``model``."""

    def run(self, model: str, inputs: Mapping[str, Any], gpus: tuple[int, ...]) -> RewardOutcome:
        """Score ``inputs`` with ``model`` on the chunk ``gpus``."""

    def close(self, unload: bool = True) -> list[str]:
        """Unload idle residents and close connections."""


def check_outputs(executor: RewardBackend) -> None:
    """:class:`ConfigError` if a model's output tensor is named like a field the pool adds."""
    for model in executor.models():
        clash = sorted({t.name for t in executor.spec(model).outputs} & RESERVED_OUTPUTS)
        if clash:
            raise ConfigError(
                f"model {model}: output tensor {clash[0]!r} clashes with a field the GPU pool "
                f"adds to results ({sorted(RESERVED_OUTPUTS)}); rename it in its config.pbtxt"
            )


def retry_delays(first: float = RETRY_FIRST_S, most: float = RETRY_MAX_S) -> Iterator[float]:
    """Backoff between attempts while Triton is unavailable: ``first``, doubling, capped at
    ``most``."""
    delay = first
    while True:
        yield delay
        delay = min(delay * 2, most)


def gave_up(exc: TritonUnavailable, retry_s: float) -> TritonUnavailable:
    """The error of an action that waited ``retry_s`` seconds for Triton in vain: names Triton,
    the setting and how to start a server."""
    from tangram_celery.reward.triton import START_HINT

    hint = "" if START_HINT in str(exc) else f"; {START_HINT}"
    return TritonUnavailable(
        f"Triton did not come back within {retry_s:g} s (TANGRAM_TRITON_RETRY_S / "
        f"--triton-retry-s), so this reward action was not run: {exc}{hint}"
    )


RESTORE_SMOOTHING = 0.3
"""Weight of a new restore time in a model's running estimate."""


def smoothed(previous: float | None, sample: float, weight: float = RESTORE_SMOOTHING) -> float:
    """An exponentially weighted running estimate: ``sample`` itself when none is known."""
    return sample if previous is None else (1 - weight) * previous + weight * sample


def residency_view(
    executor: RewardBackend, unit_of: Mapping[int, int], node_size: int,
    restore_s: Mapping[tuple[str, int], float], gpu_memory_mb: int,
) -> Residency:
    """The scheduler's view of a pool's residency: ``executor``'s residents moved onto unit
    ids (``unit_of`` maps GPU ids) and named as :func:`service_name` names them there, and
    each model's memory per GPU and measured restore times per chunk size it allows."""
    residents = []
    for resident in executor.loaded():
        units = tuple(sorted(unit_of[gpu] for gpu in resident.chunk if gpu in unit_of))
        if len(units) == len(resident.chunk):
            residents.append(Resident(service_name(resident.model, units), resident.model,
                                      units, resident.memory_mb, resident.last_used))
    services = []
    for model in executor.models():
        spec = executor.spec(model)
        sizes = [d for d in spec.dops if d <= node_size]
        services.append(Service(
            model, tuple((d, spec.memory_mb) for d in sizes),
            tuple((d, restore_s[(model, d)]) for d in sizes if (model, d) in restore_s)))
    return Residency(tuple(residents), tuple(services), gpu_memory_mb)
