"""Pure checks, at submit time, that some pool can ever run an action.

An action whose minimum exceeds every unit its pool has would otherwise wait forever in a queue or
fail inside a worker; these checks refuse it in the training script with one clear line. They
only judge what is known: a GPU pool that publishes no inventory is not checked.
"""

from __future__ import annotations

from collections.abc import Mapping

from tangram_celery.action import Action
from tangram_celery.errors import NoCapacityError, ValidationError
from tangram_celery.managers.basic import ApiSpec, needs_of
from tangram_celery.pools.inventory import GpuPoolView


def check_cpu(action: Action, node: str, cores: int) -> None:
    """Refuse a CPU action whose minimum exceeds the cores of its trajectory's node."""
    need = int(action.units().min)
    if need > cores:
        raise NoCapacityError(
            f"action {action.id} needs at least {need} cores but trajectory "
            f"{action.trajectory_id} lives on node {node}, which has {cores}; lower the minimum "
            f"of cost.cpu to at most {cores}, or start the trajectory on a larger node"
        )


def check_gpu(action: Action, pool: GpuPoolView | None) -> None:
    """Refuse a reward action for a model the pool does not serve, or more GPUs than it has
    (no check when the pool publishes no inventory or is not alive)."""
    if pool is None or not pool.alive:
        return
    model = str(action.payload.get("model", ""))
    if pool.models and model not in pool.models:
        raise ValidationError(
            "payload.model",
            f"unknown reward model {model[:80]!r} in GPU pool {pool.name!r}; it serves "
            f"{sorted(pool.models)}",
        )
    need = int(action.units().min)
    if pool.gpus and need > pool.gpus:
        raise NoCapacityError(
            f"action {action.id} needs at least {need} GPUs but GPU pool {pool.name!r} has "
            f"{pool.gpus}; lower the minimum of cost.gpu"
        )


def check_api(action: Action, specs: Mapping[str, ApiSpec]) -> None:
    """Refuse an API amount beyond what the API can ever grant at once."""
    needs_of(action, specs)
