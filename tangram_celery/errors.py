"""The single exception tree of tangram-celery.

Every error the project raises derives from :class:`TangramError`. Messages name what is wrong and
what to do next, so a training script can log them as they are.
"""

from __future__ import annotations


class TangramError(Exception):
    """Base class of every error raised by tangram-celery."""


class ConfigError(TangramError):
    """A setting is missing or malformed; the message names the ``TANGRAM_`` variable."""


class ValidationError(TangramError, ValueError):
    """An action (or another input) is invalid.

    ``field`` is the dotted path of the offending field and ``reason`` says why, so callers can
    report it without parsing the message.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"invalid action: {field}: {reason}")
        self.field = field
        self.reason = reason


class SerializationError(ValidationError):
    """A message is not JSON, or uses a serializer other than JSON (pickle is never accepted)."""


class RoutingError(TangramError):
    """No queue can take an action: no live node has room, or its pool is not configured."""


class NoCapacityError(RoutingError):
    """No live CPU node has enough memory for the trajectory; start a node or lower its memory."""


class SandboxError(TangramError):
    """The sandbox backend could not run an action (setup failed, bad spec, backend missing)."""


class SandboxSetupError(SandboxError):
    """The sandbox could not be set up or started (tool missing, cgroup or uid trouble)."""


class SandboxCapacityError(SandboxError):
    """The backend has no room for another trajectory (its uid pool is exhausted)."""


class SandboxLostError(SandboxError):
    """A sandbox died under a running action (``sandbox_lost``): its result is unknown and it was
    not rerun; the trajectory's work dir is kept and its next action gets a fresh sandbox."""


class WorkdirQuotaError(SandboxError):
    """A trajectory's work dir outgrew its quota; end the trajectory to free it."""


class SandboxSpecError(SandboxError, ValidationError):
    """An exec spec is malformed (for example a file path that leaves the work dir)."""

    def __init__(self, field: str, reason: str) -> None:
        ValidationError.__init__(self, field, reason)


class ServiceError(TangramError):
    """A service the project needs (Redis, Triton, dockerd) is missing or did not answer."""


class TritonUnavailable(ServiceError):
    """Triton did not answer (connection refused, unavailable) or lost a model it held (it was
    restarted); worth retrying until the server is back."""


class ActionTimeout(TangramError, TimeoutError):
    """A client waited longer than its timeout for an action's result; the action may still run."""


class ActionFailed(TangramError):
    """The worker could not execute an action (not the same as a non-zero exit of its command)."""


class SandboxEngineError(SandboxSetupError):
    """The container engine (dockerd) is missing, unreachable or refuses us; the message says how
    to start it or how to switch to the embedded backend."""


class BrokerUnreachable(ServiceError):
    """Redis (the broker) did not answer; the message names where (never the password) and what
    to do."""

    def __init__(self, url: str, reason: object) -> None:
        super().__init__(
            f"cannot reach the broker (Redis) at {self.where(url)}: {reason}; start Redis there "
            "or point TANGRAM_REDIS_URL at a running one"
        )

    @staticmethod
    def where(url: str) -> str:
        """``host:port/db`` of a Redis URL, without scheme or password."""
        return url.rsplit("@", 1)[-1].split("://", 1)[-1]


class BrokerAuthFailed(BrokerUnreachable):
    """Redis (the broker) refused our credentials (AUTH); the message names where (never the
    password) and which setting to fix."""

    def __init__(self, url: str, reason: object) -> None:
        ServiceError.__init__(
            self,
            f"the broker (Redis) at {self.where(url)} refused the password: {reason}; put the "
            "right one in TANGRAM_REDIS_URL (redis://:PASSWORD@host:port/db)",
        )


class GatewayRequestError(TangramError, ValueError):
    """An HTTP request to ``tangram gateway`` is malformed; ``field`` names what is wrong and
    ``reason`` says why (answered with HTTP 422)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"invalid request: {field}: {reason}")
        self.field = field
        self.reason = reason


class AlreadyAnswered(TangramError):
    """An action a fenced node held was answered meanwhile (``node_lost``, by the client that
    sent it); ``result`` is that stored answer, returned instead of running it."""

    def __init__(self, action_id: str, result: dict[str, object]) -> None:
        super().__init__(f"action {action_id} was answered while its node was fenced")
        self.result = result
