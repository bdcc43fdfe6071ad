"""HTTP front doors: ``tangram gateway``, SandboxFusion's ``/run_code`` on the tangram CPU pool.

    tangram gateway                      # 127.0.0.1:8080; verl: sandbox_fusion_url=.../run_code

Every request becomes tangram actions submitted with the real client (:mod:`.service`, the
actions in :mod:`.steps`), so it is routed, queued and scheduled like any other. SandboxFusion's
request, response and status rules are :mod:`.protocol`, the languages :mod:`.languages`, the
HTTP server :mod:`.server`, the running process (presence in Redis, idle reaper)
:mod:`.runtime` and the command :mod:`.command`.

May import: the ground floor, tasks, pools, observe and client; never the autoscaler, the stack or
the benchmarks.
"""

from tangram_celery.gateway.protocol import RunRequest, parse_run_request, response_body
from tangram_celery.gateway.runtime import Gateway, check_exposure

__all__ = ["Gateway", "RunRequest", "check_exposure", "parse_run_request", "response_body"]
