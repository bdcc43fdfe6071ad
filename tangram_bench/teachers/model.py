"""An emulated teacher for Triton's python backend: real loads and requests, work emulated by time.

The real-stack MOPD benchmark (:mod:`tangram_bench.mopd_real`) copies this file, as
``1/model.py``, into one model directory per teacher of its workload; each ``config.pbtxt``
(written by :mod:`.repository`) carries the teacher's weights, parallel fraction and the
benchmark's time scale as parameters. The GPU manager loads a teacher on a chunk of ``k``
(simulated) GPUs and says which in the ``tangram_gpus`` parameter of the load's config override;
everything that depends on the placement is computed from that ``k``:

* ``initialize`` makes the load last the restore time of the placement,
  ``(teacher_load_init_s + teacher_weights_gb / (k * teacher_restore_gbps)) * teacher_time_scale``
  (the simulator's :meth:`~tangram_bench.sim.cluster.Cluster.load_s`): the first
  instance of the load sleeps until that long after its python-backend stub process started
  (the stub's start is this emulated engine's own start, part of the restore, not added to
  it). With simulated GPUs a chunk of ``k`` is ``k`` CPU instances, each its own stub process,
  which Triton starts together; the load is done when every instance is, so it lasts the
  restore time, or longer when starting the ``k`` stubs takes longer on the machine's CPUs;
* ``execute`` sleeps, for each request, ``t1 * ((1 - p) + p / k) * teacher_time_scale``
  (Amdahl's law, as :meth:`~tangram_bench.workloads.model.ActionSpec.duration`), where
  ``t1`` is the request's one-GPU time in the workload's seconds (input ``t1``) and ``p`` the
  teacher's ``teacher_parallel``. It answers the seconds it slept (``emulated_s``) and the
  chunk size it believes it runs on (``dop``), so a benchmark can check both.

The file is self-contained (numpy, the standard library and ``triton_python_backend_utils``,
imported only inside Triton), so its two formulas can be tested without a server.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np


def chunk_size(gpus: str) -> int:
    """How many GPUs a ``tangram_gpus`` value (``"4,5"``) names; 1 when it names none."""
    return max(1, len([g for g in gpus.split(",") if g.strip()]))


def restore_seconds(load_init_s: float, weights_gb: float, restore_gbps: float, k: int,
                    time_scale: float) -> float:
    """Seconds to restore ``weights_gb`` of weights onto ``k`` GPUs, each copying its shard at
    ``restore_gbps``, after ``load_init_s`` of engine start; times ``time_scale``."""
    return (load_init_s + weights_gb / (k * restore_gbps)) * time_scale


def execute_seconds(t1: float, parallel: float, k: int, time_scale: float) -> float:
    """Seconds of one request of one-GPU time ``t1`` on ``k`` GPUs (Amdahl, parallel fraction
    ``parallel``); times ``time_scale``."""
    return t1 * ((1.0 - parallel) + parallel / k) * time_scale


def process_age_s() -> float:
    """Seconds since this process started (``/proc``, 10 ms resolution); 0 when unknown."""
    try:
        with open("/proc/uptime") as uptime, open("/proc/self/stat") as stat:
            now = float(uptime.read().split()[0])
            fields = stat.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, now - started)


def parameters(config: dict[str, Any]) -> dict[str, str]:
    """A model config's parameters as plain strings."""
    raw = config.get("parameters", {})
    return {key: str(value.get("string_value", "")) for key, value in raw.items()}


def first_instance(instance_name: str) -> bool:
    """Whether ``instance_name`` (Triton's ``<model>_<group>_<index>``) is the first instance
    of its load (index 0; a name without an index counts as the first)."""
    index = instance_name.rsplit("_", 1)[-1]
    return not index.isdigit() or int(index) == 0


class TritonPythonModel:
    """The emulated teacher (see the module docstring)."""

    def initialize(self, args: dict[str, str]) -> None:
        """Read the placement and the teacher; sleep the restore time in the first instance."""
        config = json.loads(args["model_config"])
        params = parameters(config)
        self.k = chunk_size(params.get("tangram_gpus", ""))
        self.parallel = float(params["teacher_parallel"])
        self.time_scale = float(params["teacher_time_scale"])
        self.restore_s = restore_seconds(
            float(params["teacher_load_init_s"]), float(params["teacher_weights_gb"]),
            float(params["teacher_restore_gbps"]), self.k, self.time_scale)
        if first_instance(args.get("model_instance_name", "")):
            time.sleep(max(0.0, self.restore_s - process_age_s()))

    def execute(self, requests: list[Any]) -> list[Any]:
        """Sleep each request's Amdahl time on this chunk; answer what was slept."""
        import triton_python_backend_utils as pb_utils

        responses = []
        for request in requests:
            t1 = pb_utils.get_input_tensor_by_name(request, "t1").as_numpy().astype(np.float64)
            seconds = [execute_seconds(float(v), self.parallel, self.k, self.time_scale)
                       for v in t1.reshape(-1)]
            time.sleep(sum(seconds))
            slept = np.asarray(seconds, dtype=np.float32).reshape(t1.shape)
            dop = np.full(t1.shape, self.k, dtype=np.int32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("emulated_s", slept), pb_utils.Tensor("dop", dop)]))
        return responses

    def finalize(self) -> None:
        """Nothing to release."""
