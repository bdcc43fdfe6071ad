"""``python -m tangram_bench.reward``: the reward-serving benchmark's command."""

from __future__ import annotations

from tangram_bench.reward.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
