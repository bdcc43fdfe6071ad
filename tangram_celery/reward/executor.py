"""Run one reward action on a GPU chunk: the GPU pool worker's entry point to Triton.

:class:`RewardExecutor` joins the model repository (:func:`~tangram_celery.reward.repository.
load_repository`), the evict-on-execution GPU manager (:class:`~tangram_celery.managers.gpu.
GpuManager`) and a thread-safe Triton client. ``run(model, inputs, gpus)`` validates the inputs
against the model's ``config.pbtxt``, holds the chunk, makes the service resident there (unloading
least-recently-used residents, loading it with a config override that places its instances on
those GPUs), infers, and reports what that cost in a :class:`RewardOutcome`.

With ``simulate_gpus=True`` (a machine without GPUs) the GPU ids are only labels: each chunk is
loaded as KIND_CPU instances, one per simulated GPU. Nothing here probes for GPUs; the caller says.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tangram_celery.errors import ServiceError, TritonUnavailable, ValidationError
from tangram_celery.managers.gpu import (
    Chunk,
    GpuManager,
    Resident,
    check_chunk,
    instance_group,
    placement_parameters,
)
from tangram_celery.reward.repository import ModelSpec, load_repository
from tangram_celery.reward.triton import Protocol, TritonClient


@dataclass(frozen=True)
class RewardOutcome:
    """What one reward action produced and cost.

    ``output`` maps each output tensor to a JSON value (one row given: a scalar such as
    ``{"reward": 0.93}``; several rows: one list per output). ``exec_s`` is the inference itself,
    ``setup_s`` the unloads and the load before it (overhead in the ACT), ``wait_s`` the time
    spent waiting for the chunk's GPUs. ``triton_model`` is the Triton name that served it;
    ``joined`` is True when the action shared its chunk with a running batch of its service.
    ``started_at`` / ``finished_at`` are the wall-clock stamps (``time.time()``) of the inference.
    """

    output: dict[str, Any]
    exec_s: float
    setup_s: float
    loaded: bool
    evicted: list[str] = field(default_factory=list)
    wait_s: float = 0.0
    triton_model: str = ""
    joined: bool = False
    started_at: float = 0.0
    finished_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict of every field."""
        return {
            "output": self.output,
            "exec_s": self.exec_s,
            "setup_s": self.setup_s,
            "wait_s": self.wait_s,
            "loaded": self.loaded,
            "evicted": list(self.evicted),
            "triton_model": self.triton_model,
            "joined": self.joined,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }


def default_repository() -> Path:
    """The ``triton_models/`` directory beside the package (a source checkout)."""
    return Path(__file__).resolve().parents[2] / "triton_models"


class _TritonActuator:
    """Loads and unloads per-chunk services through Triton's repository API."""

    def __init__(self, client: TritonClient, specs: Mapping[str, ModelSpec], simulated: bool):
        self.client = client
        self.specs = specs
        self.simulated = simulated

    def load(self, name: str, model: str, chunk: Chunk) -> None:
        spec = self.specs[model]
        config = spec.override(
            name,
            instance_group(chunk, self.simulated),
            placement_parameters(chunk, self.simulated),
        )
        self.client.load(name, config=config, files=spec.files)

    def unload(self, name: str) -> None:
        self.client.unload(name)


class RewardExecutor:
    """Runs reward actions on GPU chunks through Triton (thread-safe; one per pool worker).

    ``triton_url`` is ``host:port`` of the server's HTTP endpoint (gRPC with
    ``protocol="grpc"``). ``gpu_ids`` are the pool's GPUs; ``gpu_memory_mb`` the memory for
    weights on each, against each model's ``tangram_memory_mb``. ``simulate_gpus`` says that the
    machine has no GPU and the ids are simulated on CPU. ``namespace`` (a GPU pool's name)
    prefixes the Triton names of its services, so pools sharing a server never collide. ``key``
    is the server's ``TANGRAM_TRITON_KEY``, sent with its loads and unloads. Nothing connects
    in ``__init__``.
    """

    def __init__(
        self,
        triton_url: str,
        model_repository: Path | str | None = None,
        *,
        gpu_ids: Sequence[int] = tuple(range(8)),
        gpu_memory_mb: int = 81920,
        simulate_gpus: bool = True,
        protocol: Protocol = "http",
        batch_same_service: bool = True,
        timeout_s: float = 300.0,
        wait_timeout_s: float | None = None,
        namespace: str = "",
        key: str = "",
    ) -> None:
        self.specs = load_repository(model_repository or default_repository())
        self.client = TritonClient(triton_url, protocol, timeout_s, key=key)
        self.simulate_gpus = simulate_gpus
        self.manager = GpuManager(
            gpu_ids,
            gpu_memory_mb,
            _TritonActuator(self.client, self.specs, simulate_gpus),
            batch_same_service=batch_same_service,
            wait_timeout_s=wait_timeout_s,
            namespace=namespace,
        )
        self._stale = False

    def ready(self) -> bool:
        """Whether the Triton server answers and is ready."""
        return self.client.ready()

    def residents(self) -> list[tuple[str, Chunk]]:
        """(model, chunk) of every resident service, by Triton name."""
        return [(r.model, r.chunk) for _, r in sorted(self.manager.residents().items())]

    def loaded(self) -> list[Resident]:
        """Every resident service with its memory and last use (chunks of GPU ids)."""
        return [r for _, r in sorted(self.manager.residents().items())]

    def models(self) -> list[str]:
        """The reward models this executor can run."""
        return sorted(self.specs)

    def spec(self, model: str) -> ModelSpec:
        """The config-derived spec of ``model``, or :class:`ValidationError` on ``model``."""
        if not isinstance(model, str) or model not in self.specs:
            raise ValidationError(
                "model", f"unknown reward model {model!r}; known: {self.models()}"
            )
        return self.specs[model]

    def check(self, model: str, inputs: Mapping[str, Any], gpus: Sequence[int]) -> Chunk:
        """Validate a request without running it; returns the chunk."""
        spec = self.spec(model)
        spec.encode(inputs)
        return check_chunk(gpus, self.manager.gpu_ids, spec.dops)

    def rank_chunks(self, model: str, chunks: Sequence[Chunk]) -> list[Chunk]:
        """Candidate chunks best first: idle, already holding ``model``, fewest evictions."""
        return self.manager.rank(model, chunks, self.spec(model).memory_mb)

    def run(self, model: str, inputs: Mapping[str, Any], gpus: tuple[int, ...]) -> RewardOutcome:
        """Score ``inputs`` with ``model`` on the chunk ``gpus``.

        Raises :class:`ValidationError` for a bad model, input or chunk (also when the model
        rejects the request), :class:`TritonUnavailable` when Triton does not answer or lost the
        service (it was restarted: worth retrying; the next run first re-reads which services
        the server holds and loads again what it lost) and :class:`ServiceError` when a load
        fails.
        """
        spec = self.spec(model)
        arrays, single = spec.encode(inputs)
        chunk = check_chunk(gpus, self.manager.gpu_ids, spec.dops)
        if self._stale:
            self.resync()
        try:
            return self._run(model, spec, arrays, single, chunk)
        except TritonUnavailable:
            self._stale = True
            raise

    def resync(self) -> list[str]:
        """Drop the idle residents that Triton no longer holds READY (after a server restart,
        the manager's record is stale); returns their names. :class:`TritonUnavailable` while
        the server is down."""
        held = {str(m.get("name")) for m in self.client.index() if m.get("state") == "READY"}
        dropped = self.manager.retain(held)
        self._stale = False
        return dropped

    def _run(
        self, model: str, spec: ModelSpec, arrays: Mapping[str, Any], single: bool, chunk: Chunk
    ) -> RewardOutcome:
        with self.manager.lease(model, spec.memory_mb, chunk) as lease:
            started_at, started = time.time(), time.perf_counter()
            try:
                outputs = self.client.infer(lease.name, spec, arrays)
            except TritonUnavailable:
                self.manager.forget(lease.name)
                raise
            except (ServiceError, ValidationError) as exc:
                if self._lost(lease.name):
                    self.manager.forget(lease.name)
                    raise TritonUnavailable(
                        f"Triton no longer holds {lease.name} (was the server restarted?); it is "
                        f"loaded again on the next attempt ({exc})"
                    ) from exc
                raise
            exec_s = time.perf_counter() - started
            finished_at = time.time()
        return RewardOutcome(
            output=spec.decode(outputs, single),
            exec_s=exec_s,
            setup_s=lease.setup_s,
            loaded=lease.loaded,
            evicted=list(lease.evicted),
            wait_s=lease.wait_s,
            triton_model=lease.name,
            joined=lease.joined,
            started_at=started_at,
            finished_at=finished_at,
        )

    def _lost(self, name: str) -> bool:
        """Whether Triton no longer holds ``name`` ready (or does not answer at all)."""
        try:
            return not self.client.model_ready(name)
        except ServiceError:
            return True

    def close(self, unload: bool = True) -> list[str]:
        """Unload this executor's idle residents (when ``unload``) and close the clients."""
        try:
            return self.manager.unload_all() if unload else []
        finally:
            self.client.close()
