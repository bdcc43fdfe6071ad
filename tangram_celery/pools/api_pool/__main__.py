"""``python -m tangram_celery.pools.api_pool``: run an API pool worker."""

from __future__ import annotations

import sys

from tangram_celery.pools.api_pool.worker import main

if __name__ == "__main__":
    sys.exit(main())
