"""Thin entry point of an API pool worker: ``python workers/api_pool.py --api NAME``.

Equivalent to ``python -m tangram_celery.pools.api_pool ...``; configuration comes from ``TANGRAM_``
variables (the API's limits from ``TANGRAM_API_LIMITS``).
"""

from __future__ import annotations

import sys

from tangram_celery.pools.api_pool.worker import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
