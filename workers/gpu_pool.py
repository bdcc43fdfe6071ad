"""Thin entry point of a GPU pool worker: ``python workers/gpu_pool.py --pool NAME --gpus N``.

Equivalent to ``python -m tangram_celery.pools.gpu_pool ...``; configuration comes from ``TANGRAM_``
variables (Triton: ``TANGRAM_TRITON_URL``, ``TANGRAM_TRITON_PROTOCOL``,
``TANGRAM_TRITON_REPOSITORY``; GPUs: ``TANGRAM_GPU_SIMULATED``, ``TANGRAM_GPU_MEMORY_MB``).
"""

from __future__ import annotations

import sys

from tangram_celery.pools.gpu_pool.worker import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
