"""``python -m tangram_bench.elastic``: ``tangram bench coding --mode real``."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from tangram_bench.suite import main as suite_main


def main(argv: Sequence[str] | None = None) -> int:
    """``tangram bench coding --mode real`` with this module's defaults."""
    return suite_main(["coding", "--mode", "real", *(argv or sys.argv[1:])])


if __name__ == "__main__":
    sys.exit(main())
