"""A temporary Triton model repository of emulated teachers, one model per teacher service.

:func:`write_repository` writes, for each :class:`~tangram_bench.workloads.model.
GpuService` of a workload, ``<dir>/<name>/config.pbtxt`` and ``<dir>/<name>/1/model.py`` (a copy
of :mod:`.model`). The config declares what the GPU manager reads (``tangram_dops``: the
teacher's allowed parallelisms; ``tangram_memory_mb``: its memory per GPU) and what the model
reads (weights, parallel fraction, restore physics, the time scale). Nothing is added to the
project's ``triton_models/``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tangram_bench.workloads.model import GpuService

MODEL_FILE = Path(__file__).with_name("model.py")


@dataclass(frozen=True)
class TeacherPhysics:
    """What an emulated teacher's restore and requests cost, in the workload's seconds."""

    load_init_s: float = 2.0
    restore_gbps: float = 10.0
    time_scale: float = 1.0


def memory_mb(service: GpuService) -> int:
    """The ``tangram_memory_mb`` of a teacher: its memory per GPU at its smallest parallelism.

    The GPU manager keeps one memory figure per model whatever the chunk (the simulator charges
    ``weights / dop * (1 + kv)`` per GPU at each parallelism), so the figure that is never
    too small, the one at the smallest parallelism, is declared.
    """
    return service.memory_mb(service.dops[0])


def config_text(service: GpuService, parallel: float, physics: TeacherPhysics) -> str:
    """The ``config.pbtxt`` of one teacher."""
    params: Mapping[str, str] = {
        "tangram_dops": ",".join(str(d) for d in service.dops),
        "tangram_memory_mb": str(memory_mb(service)),
        "teacher_weights_gb": repr(float(service.weights_gb)),
        "teacher_parallel": repr(float(parallel)),
        "teacher_load_init_s": repr(float(physics.load_init_s)),
        "teacher_restore_gbps": repr(float(physics.restore_gbps)),
        "teacher_time_scale": repr(float(physics.time_scale)),
    }
    lines = [
        f"# Emulated teacher {service.name} ({service.weights_gb:g} GB of weights, parallel "
        f"fraction {parallel:g}), written by tangram_bench.teachers.repository.",
        f'name: "{service.name}"',
        'backend: "python"',
        "max_batch_size: 8",
        'input [ { name: "t1" data_type: TYPE_FP32 dims: [ 1 ] } ]',
        "output [",
        '  { name: "emulated_s" data_type: TYPE_FP32 dims: [ 1 ] },',
        '  { name: "dop" data_type: TYPE_INT32 dims: [ 1 ] }',
        "]",
        "instance_group [ { kind: KIND_CPU count: 1 } ]",
    ]
    lines += [f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}'
              for key, value in params.items()]
    return "\n".join(lines) + "\n"


def write_repository(target: Path, services: Sequence[GpuService],
                     parallel: Mapping[str, float], physics: TeacherPhysics) -> Path:
    """Write one emulated teacher per service under ``target`` (created); returns it.
    ``parallel`` maps each service to its parallel fraction."""
    code = MODEL_FILE.read_bytes()
    for service in services:
        folder = target / service.name
        (folder / "1").mkdir(parents=True, exist_ok=True)
        (folder / "config.pbtxt").write_text(config_text(service, parallel[service.name],
                                                         physics))
        (folder / "1" / "model.py").write_bytes(code)
    return target
