"""``python -m tangram_celery.reward.server``: ``tangram triton`` without the ``tangram`` CLI."""

from __future__ import annotations

from tangram_celery.reward.server.command import main

if __name__ == "__main__":
    raise SystemExit(main())
