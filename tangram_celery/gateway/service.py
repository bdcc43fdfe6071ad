"""The gateway's work behind the HTTP server: one ``/run_code`` request as tangram actions.

:class:`RunCodeService` turns a checked :class:`~tangram_celery.gateway.protocol.RunRequest` into
one action (its compile and run steps and the files it fetches,
:mod:`~tangram_celery.gateway.steps`), submits it with the real
:class:`~tangram_celery.client.TangramClient` (so it is routed, queued and scheduled like any other
action), waits for it, and builds SandboxFusion's response. A request runs in a one-request
trajectory, in a recycled sandbox its node wipes afterwards (the node also ends the trajectory: no
end message), unless it names one (``X-Tangram-Trajectory``): a named trajectory keeps its files
until ``DELETE /v1/trajectories/NAME`` or until it has been idle for
``TANGRAM_GATEWAY_TRAJECTORY_IDLE_S``. A busy pool makes requests wait (the node queues them; while
no node has memory for another trajectory, the client parks them in the shared memory line, first
come first served, for up to ``TANGRAM_GATEWAY_WAIT_S``); it never refuses them. A request whose
trajectory no node could ever hold is answered ``SandboxError`` at once.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis
from kombu.exceptions import OperationalError

from tangram_celery.action import Action, ActionResult
from tangram_celery.client import TangramClient
from tangram_celery.errors import (
    ActionFailed,
    ActionTimeout,
    GatewayRequestError,
    NoCapacityError,
    RoutingError,
    ServiceError,
    TangramError,
    ValidationError,
)
from tangram_celery.gateway.jupyter import JupyterRequest, driver_code, jupyter_response
from tangram_celery.gateway.languages import LANGUAGES, unsupported
from tangram_celery.gateway.protocol import RunRequest, response_body, sandbox_error
from tangram_celery.gateway.steps import (
    StepConfig,
    command_results,
    fetched,
    memory_mb,
    pytest_signature,
    request_action,
    time_split,
)
from tangram_celery.settings import Settings

log = logging.getLogger(__name__)
TRAJECTORY_PREFIX = "gw:"
"""Named trajectories live under this prefix, apart from those of other clients."""
FRESH_PREFIX = "gw-"
TIMINGS = "_tangram_timings"
"""Where a response's time split travels to the server, which sends it as a header."""
BROKER_CALLS = 32
"""Requests that talk to Redis at once (submit, end); the others wait their turn, so a burst
of any size stays within the client's connection pool. Waiting for results needs no turn."""


def trajectory_for(name: str | None) -> tuple[str, bool]:
    """(trajectory id, kept) for a request's ``X-Tangram-Trajectory`` header (None: a fresh
    one, ended after the request). Raises :class:`GatewayRequestError` for a bad name."""
    if name is None:
        return FRESH_PREFIX + uuid.uuid4().hex, False
    trajectory_id = TRAJECTORY_PREFIX + name
    if not name or len(trajectory_id) > 128 or not all(
            c.isascii() and (c.isalnum() or c in "._:-") for c in name):
        raise GatewayRequestError("X-Tangram-Trajectory", "1-120 characters of A-Z a-z 0-9 . _ "
                                  ": - (the name of a trajectory that keeps its files)")
    return trajectory_id, True


class RunCodeService:
    """Runs ``/run_code`` requests as actions on the CPU pool; thread-safe."""

    def __init__(self, settings: Settings, client: TangramClient, languages: tuple[str, ...],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.client = client
        self.languages = languages
        self.config = StepConfig(memory_default_mb=settings.sandbox.memory_mb,
                                 pytest_max_cores=settings.gateway.pytest_max_cores)
        self._clock = clock
        self._lock = threading.Lock()
        self._kept: dict[str, float] = {}
        self._broker_turns = threading.BoundedSemaphore(BROKER_CALLS)
        self._enders = ThreadPoolExecutor(2, thread_name_prefix="tangram-gateway-end")
        self.served = 0
        self.in_flight = 0

    def run(self, request: RunRequest, trajectory: str | None = None,
            signature: str | None = None, session: bool = False) -> dict[str, Any]:
        """The SandboxFusion response to one request (raises :class:`GatewayRequestError` for a
        bad header); ``session``: run it in the named trajectory's Python session."""
        trajectory_id, kept = trajectory_for(trajectory)
        if session and (not kept or request.language != "python"):
            raise GatewayRequestError("X-Tangram-Session", "a session needs a trajectory name "
                                      "(X-Tangram-Trajectory) and language 'python'")
        with self._lock:
            self.in_flight += 1
            if kept:
                self._kept[trajectory_id] = self._clock()
        try:
            return self._run(request, trajectory_id, kept, signature, session)
        finally:
            with self._lock:
                self.in_flight -= 1
                self.served += 1
                if kept and trajectory_id in self._kept:
                    self._kept[trajectory_id] = self._clock()

    def run_jupyter(self, request: JupyterRequest) -> dict[str, Any]:
        """SandboxFusion's ``/run_jupyter`` answer: the cells in a fresh kernel (see
        :mod:`~tangram_celery.gateway.jupyter`), one action in a recycled sandbox."""
        with self._lock:
            self.in_flight += 1
        try:
            run = dataclasses.replace(request.run, code=driver_code(request))
            answer = self._run(run, FRESH_PREFIX + uuid.uuid4().hex, False, None)
        finally:
            with self._lock:
                self.in_flight -= 1
                self.served += 1
        if answer.get("run_result") is None:
            return jupyter_response(ActionResult("", "", "exec", "error",
                                                 error=str(answer.get("message"))),
                                    None, {}, None)
        result = ActionResult("", "", "exec", "ok")
        return jupyter_response(result, answer["run_result"], answer.get("files") or {},
                                answer.get("executor_pod_name"))

    def end(self, name: str) -> str:
        """End a named trajectory now (``DELETE /v1/trajectories/NAME``); idempotent."""
        trajectory_id, _ = trajectory_for(name)
        with self._lock:
            self._kept.pop(trajectory_id, None)
        self._end(trajectory_id, self.settings.gateway.wait_s)
        return trajectory_id

    def reap_idle(self) -> list[str]:
        """End the named trajectories idle longer than ``TANGRAM_GATEWAY_TRAJECTORY_IDLE_S``."""
        cutoff = self._clock() - self.settings.gateway.trajectory_idle_s
        with self._lock:
            idle = [t for t, last in self._kept.items() if last < cutoff]
            for trajectory_id in idle:
                del self._kept[trajectory_id]
        for trajectory_id in idle:
            self._end(trajectory_id)
        return idle

    def close(self) -> None:
        """Wait until the trajectories of answered requests are ended."""
        self._enders.shutdown(wait=True)

    def kept(self) -> list[str]:
        """The named trajectories the gateway keeps now."""
        with self._lock:
            return sorted(self._kept)

    def _run(self, request: RunRequest, trajectory_id: str, kept: bool,
             signature: str | None, session: bool = False) -> dict[str, Any]:
        if request.language not in self.languages:
            return sandbox_error(unsupported(request.language, self.languages))
        language = LANGUAGES[request.language]
        started = self._clock()
        deadline = started + self.settings.gateway.wait_s
        key = pytest_signature(request, signature) if language.elastic else ""
        try:
            action = request_action(request, language, trajectory_id, self.config, key,
                                    ephemeral=not kept, session=session)
            result = self._result(action, deadline)
        except NoCapacityError as exc:
            return sandbox_error(f"no CPU node can give this request {exc}; ask for less "
                                 "memory_limit_MB, or add a node with more memory")
        except (ValidationError, RoutingError, ServiceError, ActionFailed,
                ActionTimeout) as exc:
            return sandbox_error(f"tangram could not run the request: {exc}")
        except (redis.RedisError, OperationalError) as exc:
            return sandbox_error(f"tangram could not reach its broker: {exc}")
        compiled, ran = command_results(result, language.compile is not None,
                                        memory_mb(request, self.config))
        files, problem = fetched(result)
        answer = response_body(compiled, ran, files, result.node or None, problem)
        answer[TIMINGS] = time_split(result, self._clock() - started)
        return answer

    def _result(self, action: Action, deadline: float) -> ActionResult:
        """Submit one action (parked by the client while no node has room for its trajectory)
        and wait for its result until ``deadline``."""
        with self._broker_turns:
            handle = self.client.submit(action)
        return handle.result(max(deadline - self._clock(), 1.0))

    def _end(self, trajectory_id: str, wait_s: float = 0.0) -> None:
        try:
            with self._broker_turns:
                confirmed = self.client.end_trajectory(trajectory_id, wait_s)
        except (TangramError, redis.RedisError, OperationalError, OSError):
            log.warning("could not end trajectory %s", trajectory_id, exc_info=True)
            return
        if not confirmed:
            log.warning("trajectory %s: its node did not confirm the end within %.0f s",
                        trajectory_id, wait_s)
