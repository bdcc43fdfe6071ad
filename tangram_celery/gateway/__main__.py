"""``python -m tangram_celery.gateway``: run the SandboxFusion-compatible gateway."""

import sys

from tangram_celery.gateway.command import main

sys.exit(main())
