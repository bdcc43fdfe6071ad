"""The reward-serving benchmark: what it measures on the real tritonserver, and its parts.

For each model of the repository (or those named with ``--model``):

* **load (restore) time**: load under a per-chunk name, exactly as the GPU manager does (config
  override + uploaded ``model.py``, one instance), p50 over ``--loads`` load/unload cycles;
* **p50 / p90 latency** of one-row requests sent one after another;
* **throughput against concurrency** (``--concurrency 1,8,32,64``: a GRPO step scores hundreds of
  responses at once) with the config's dynamic batching and with it removed (each request executes
  alone). Both variants are loaded side by side on the same server from the same ``model.py``,
  one CPU instance each, and get the same one-row requests from the same client: a single asyncio
  event loop with ``concurrency`` closed-loop senders (``tritonclient``'s gRPC or HTTP aio client),
  taking turns through a fixed pool of varied requests (:func:`samples`). The points are measured
  in ``--rounds`` interleaved rounds (batched first in even rounds, unbatched first in odd ones) so
  that the load of a shared machine falls on both; a point reports the median of its rounds, the
  ratio of the medians, the lowest and highest per-round ratio, and the rows per execution that
  Triton's statistics API counted for the batched variant.

The request pool is :mod:`.pool`, the measurements :mod:`.measure` (with NVIDIA's
``perf_analyzer`` through :mod:`.perf_analyzer`), the figures and their table :mod:`.results`,
the command :mod:`.cli` (``python -m tangram_bench.reward``).
"""

from __future__ import annotations

from tangram_bench.reward.measure import percentile

__all__ = [
    "percentile",
]
