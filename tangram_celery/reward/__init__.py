"""The reward path: Triton Inference Server, its client, and the GPU-pool executor.

* :mod:`tangram_celery.reward.server` launches the ``tritonserver`` binary of ``nvidia-pytriton``
  on the model repository (``triton_models/``).
* :mod:`tangram_celery.reward.repository` reads the repository's ``config.pbtxt`` files, the
  single source of tensor names and dtypes.
* :mod:`tangram_celery.reward.triton` wraps ``tritonclient`` (one client per thread).
* :mod:`tangram_celery.reward.executor` runs one reward action on a GPU chunk through the
  evict-on-execution GPU manager (:mod:`tangram_celery.managers.gpu`).

Importing this package starts nothing and opens no connection.

May import: the ground floor and managers.
"""
