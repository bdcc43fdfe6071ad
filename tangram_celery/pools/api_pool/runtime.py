"""The API pool runtime: one API worker's manager gate and the HTTP calls of its actions."""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

import redis

from tangram_celery.action import Action, ActionResult, Timings, parse_action
from tangram_celery.errors import ConfigError, TangramError, ValidationError
from tangram_celery.managers.basic import ApiGate, Need, needs_of
from tangram_celery.pools.api_pool.calls import ApiCall, call_url, parse_calls
from tangram_celery.pools.api_pool.transport import http_call, reply_output
from tangram_celery.pools.conversion import action_limits
from tangram_celery.pools.serving import rejected_result
from tangram_celery.settings import Settings


class ApiPool:
    """The runtime of one API worker: its manager gate, and the HTTP calls of its actions."""

    def __init__(self, settings: Settings, api: str, gate: ApiGate, name: str = "") -> None:
        self.settings = settings
        self.specs = gate.store.specs
        if api not in self.specs:
            raise ConfigError(
                f"API {api!r} is not declared in TANGRAM_API_LIMITS (declared: "
                f"{sorted(self.specs) or 'none'}); add {api}=url:...,concurrency:N or rate:N/1s"
            )
        self.api = api
        self.spec = self.specs[api]
        self.gate = gate
        self.name = name or f"api-{api}@{socket.gethostname()}"
        self._limits = action_limits(settings)

    def start(self) -> None:
        """Start the gate's pump."""
        self.gate.start()

    def stop(self) -> None:
        """Stop the gate (waiting actions get an error result)."""
        self.gate.stop()

    def end_trajectory(self, trajectory_id: str) -> None:
        """Nothing to free: API actions keep no per-trajectory environment."""

    def execute(self, message: Mapping[str, Any], received: float) -> dict[str, Any]:
        """Run one action message to completion; never raises for a bad message."""
        try:
            action = parse_action(message, self._limits)
            if action.pool != "api":
                raise ValidationError("kind", f"{action.kind} actions do not run on API pools")
            calls = parse_calls(action)
            needs = needs_of(action, self.specs)
        except ValidationError as exc:
            return rejected_result(message, str(exc), self.name, received)
        return self._run(action, calls, needs, received).to_json()

    def _run(self, action: Action, calls: Sequence[ApiCall], needs: Sequence[Need],
             received: float) -> ActionResult:
        timings = Timings(received=received)
        result = ActionResult(action.id, action.trajectory_id, action.kind, "error",
                              node=self.name, timings=timings)
        try:
            grant = self.gate.acquire(action.id, needs, trajectory=action.trajectory_id)
        except (redis.RedisError, TangramError) as exc:
            result.error = f"could not get the API slots: {exc}"
            timings.admitted = timings.exec_started = timings.exec_finished = time.time()
            timings.stored = time.time()
            return result
        timings.admitted = time.time()
        try:
            self._call_all(action, calls, result)
        finally:
            self.gate.release(grant)
        timings.stored = time.time()
        return result

    def _call_all(self, action: Action, calls: Sequence[ApiCall], result: ActionResult) -> None:
        timings = result.timings
        deadline = time.monotonic() + (action.timeout_s or self.settings.actions.default_timeout_s)
        responses: list[dict[str, Any]] = []
        timings.exec_started = time.time()
        start = time.perf_counter()
        result.status = "ok"
        for call in calls:
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError("no time left for this call")
                reply = http_call(call_url(self.specs[call.api], call), call.method, call.body,
                                  call.headers, left, self.settings.sandbox.output_cap_bytes)
            except TimeoutError as exc:
                result.status, result.error = "timeout", f"{call.api} {call.path}: {exc}"
                break
            except (OSError, ValidationError) as exc:
                result.status, result.error = "failed", f"{call.api} {call.path}: {exc}"
                break
            responses.append(reply_output(call, reply))
            if not 200 <= reply.status < 300:
                result.status = "failed"
                result.error = f"{call.api} {call.method} {call.path}: HTTP {reply.status}"
                break
        timings.exec_s = time.perf_counter() - start
        timings.exec_finished = time.time()
        result.output = {"responses": responses,
                         "status_code": responses[-1]["status_code"] if responses else None}
