"""``tangram bench ...``: the entry point the ``tangram`` command finds through the
``tangram.commands`` entry-point group."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from tangram_bench import install_hint, missing_requirements


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``tangram bench <argv>``: ``overhead``, ``costs``, ``malleable``, ``takeback`` or one of
    :mod:`tangram_bench.suite`'s workloads; exits 2 with what to install when the bench extra
    is missing."""
    given = list(sys.argv[1:] if argv is None else argv)
    missing = missing_requirements()
    if missing:
        print(f"tangram: error: `tangram bench` needs {', '.join(missing)}, which the bench "
              f"extra installs: {install_hint()}", file=sys.stderr)
        return 2
    if given[:1] == ["malleable"]:
        from tangram_bench.malleable import main as malleable_main

        return malleable_main(given[1:])
    if given[:1] == ["takeback"]:
        from tangram_bench.takeback import main as takeback_main

        return takeback_main(given[1:])
    if given[:1] == ["costs"]:
        from tangram_bench.costs_bench import main as costs_main

        return costs_main(given[1:])
    if given[:1] == ["overhead"]:
        from tangram_bench.overhead import main as overhead_main

        return overhead_main(given[1:])
    from tangram_bench.suite import main as suite_main

    return suite_main(given)


if __name__ == "__main__":
    raise SystemExit(main())
