"""``python -m tangram_bench.mopd_real``: ``tangram bench mopd --mode real``."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from tangram_bench.suite import main as suite_main


def main(argv: Sequence[str] | None = None) -> int:
    """``tangram bench mopd --mode real`` with this module's defaults."""
    return suite_main(["mopd", "--mode", "real", *(argv or sys.argv[1:])])


if __name__ == "__main__":
    sys.exit(main())
