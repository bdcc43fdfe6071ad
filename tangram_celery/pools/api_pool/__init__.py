"""The API pool runtime: what a basic (quota-limited) worker does with each ``api`` action.

Like a CPU node it validates the message again, waits in its gate (oldest trajectory first,
until the basic manager grants every API the action's cost names), runs the action, gives the
slots back whatever happens, and returns an :class:`~tangram_celery.action.ActionResult` with the
same timestamps, so ACT splits into queue / exec / overhead exactly as for CPU actions.

An ``api`` action's payload is one call or a list of calls, run in order while the action holds
its APIs::

    {"api": "search", "method": "GET", "path": "/search", "params": {"q": "tangram"}}
    {"calls": [{"api": "search", "path": "/search", "params": {"q": "x"}},
               {"api": "judge", "method": "POST", "path": "/score", "json": {"text": "..."}}]}

``api`` may be left out when the action names a single API. A call only ever reaches a path below
the API's declared base URL (``TANGRAM_API_LIMITS``): no host, scheme, ``..`` or redirect from a
payload is followed (no SSRF). Run one worker per API::

    python -m tangram_celery.pools.api_pool --api search   # or: python workers/api_pool.py --api
"""

from __future__ import annotations

from tangram_celery.pools.api_pool.calls import ApiCall, api_action, call_url, parse_calls
from tangram_celery.pools.api_pool.runtime import ApiPool
from tangram_celery.pools.api_pool.transport import http_call
from tangram_celery.pools.api_pool.worker import (
    default_window,
    spawn_api_worker,
    wait_for_worker,
    worker_name,
)

__all__ = [
    "ApiCall",
    "ApiPool",
    "api_action",
    "call_url",
    "default_window",
    "http_call",
    "parse_calls",
    "spawn_api_worker",
    "wait_for_worker",
    "worker_name",
]
