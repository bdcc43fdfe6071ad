"""Thin entry point of a CPU node worker: ``python workers/cpu_node.py --node N --cores K``.

Equivalent to ``tangram worker cpu ...``; configuration comes from ``TANGRAM_`` variables.
"""

from __future__ import annotations

import sys

from tangram_celery.cli import main

if __name__ == "__main__":
    sys.exit(main(["worker", "cpu", *sys.argv[1:]]))
