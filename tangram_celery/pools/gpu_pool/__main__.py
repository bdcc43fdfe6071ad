"""``python -m tangram_celery.pools.gpu_pool``: run a GPU pool worker."""

from __future__ import annotations

import sys

from tangram_celery.pools.gpu_pool.worker import main

if __name__ == "__main__":
    sys.exit(main())
