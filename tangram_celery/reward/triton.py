"""The Triton client: a thread-safe wrapper over ``tritonclient`` (HTTP or gRPC).

``tritonclient`` clients must not be shared across threads (greenlet errors, then a hang), so
:class:`TritonClient` keeps one client per thread. Errors are mapped onto the project's tree:
Triton unreachable or a failed load -> :class:`ServiceError`, a request the model rejects ->
:class:`ValidationError`. Requests follow the model's
:class:`~tangram_celery.reward.repository.ModelSpec`; a load may carry that spec's config override
and files (the "file override" of :mod:`tangram_celery.reward.repository`).
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from tritonclient.utils import InferenceServerException

from tangram_celery.errors import ServiceError, TritonUnavailable, ValidationError
from tangram_celery.reward.repository import ModelSpec
from tangram_celery.reward.server.process import GRPC_KEY_HEADER, KEY_HEADER

Protocol = Literal["http", "grpc"]
REJECTED_MARK = "invalid request:"
INVALID_STATUSES = frozenset({"400", "StatusCode.INVALID_ARGUMENT"})
START_HINT = "start one with: python -m tangram_celery.reward.server --repository triton_models"
RESTRICTED_MARK = "is restricted, expecting header"


class TritonClient:
    """A thread-safe facade over ``tritonclient.http`` / ``tritonclient.grpc``.

    Each thread gets its own underlying client, created on first use (nothing connects in
    ``__init__``). ``url`` is ``host:port`` of the chosen protocol's endpoint. ``key``
    (``TANGRAM_TRITON_KEY``) goes with every call of the repository API (index, load, unload),
    which a server started with a key refuses without it.
    """

    def __init__(self, url: str, protocol: Protocol = "http", timeout_s: float = 300.0,
                 key: str = "") -> None:
        if protocol not in ("http", "grpc"):
            raise ValidationError("protocol", f"{protocol!r}: choose 'http' or 'grpc'")
        self.url = url.removeprefix("http://").removeprefix("grpc://")
        self.protocol = protocol
        self.timeout_s = timeout_s
        header = KEY_HEADER if protocol == "http" else GRPC_KEY_HEADER
        self._admin = {header: key} if key else None
        self._local = threading.local()
        self._clients: list[Any] = []
        self._lock = threading.Lock()

    def ready(self) -> bool:
        """Whether the server answers and is ready (False when it is down)."""
        try:
            return bool(self._client().is_server_ready())
        except (OSError, http.client.HTTPException, InferenceServerException):
            return False

    def model_ready(self, name: str) -> bool:
        """Whether model ``name`` is loaded and ready."""
        return bool(self._call("model ready", lambda c: c.is_model_ready(name)))

    def index(self) -> list[dict[str, Any]]:
        """The server's repository index: ``[{"name", "version"?, "state"?}, ...]``."""
        if self.protocol == "http":
            raw = self._call("repository index",
                             lambda c: c.get_model_repository_index(headers=self._admin))
            return [dict(m) for m in raw]
        raw = self._call("repository index",
                         lambda c: c.get_model_repository_index(headers=self._admin, as_json=True))
        return [dict(m) for m in raw.get("models", [])]

    def model_config(self, name: str) -> dict[str, Any]:
        """The config of a loaded model, as the server holds it."""
        if self.protocol == "http":
            config = self._call("model config", lambda c: c.get_model_config(name))
            return dict(config)
        raw = self._call("model config", lambda c: c.get_model_config(name, as_json=True))
        return dict(raw.get("config", {}))

    def load(
        self,
        name: str,
        config: Mapping[str, Any] | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        """Load (or reload) ``name``, optionally with a JSON config override and model files."""
        text = json.dumps(config) if config is not None else None
        self._call(f"load of {name}",
                   lambda c: c.load_model(name, headers=self._admin, config=text, files=files))

    def unload(self, name: str) -> None:
        """Unload ``name`` (Triton lets its in-flight requests finish first)."""
        self._call(f"unload of {name}", lambda c: c.unload_model(name, headers=self._admin))

    def infer(
        self, name: str, spec: ModelSpec, arrays: Mapping[str, NDArray[Any]]
    ) -> dict[str, NDArray[Any]]:
        """Run ``name`` (loaded from ``spec``) on ``arrays``; one array per output tensor."""
        module = self._module()
        batched = spec.max_batch_size > 0
        request = []
        for tensor in spec.inputs:
            array = arrays[tensor.name]
            item = module.InferInput(tensor.name, list(array.shape), tensor.datatype)
            item.set_data_from_numpy(array)
            request.append(item)
        wanted = [module.InferRequestedOutput(t.name) for t in spec.outputs]
        result = self._call(
            f"inference on {name}", lambda c: c.infer(name, request, outputs=wanted)
        )
        outputs = {t.name: result.as_numpy(t.name) for t in spec.outputs}
        if not batched:
            outputs = {k: v[np.newaxis] for k, v in outputs.items()}
        return outputs

    def close(self) -> None:
        """Close every per-thread client."""
        with self._lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()
        self._local = threading.local()

    def _module(self) -> Any:
        if self.protocol == "http":
            import tritonclient.http as module
        else:
            import tritonclient.grpc as module
        return module

    def _client(self) -> Any:
        client = getattr(self._local, "client", None)
        if client is None:
            module = self._module()
            if self.protocol == "http":
                client = module.InferenceServerClient(
                    self.url, connection_timeout=self.timeout_s, network_timeout=self.timeout_s
                )
            else:
                client = module.InferenceServerClient(self.url)
            self._local.client = client
            with self._lock:
                self._clients.append(client)
        return client

    def _call(self, what: str, action: Any) -> Any:
        try:
            return action(self._client())
        except (OSError, http.client.HTTPException) as exc:  # refused, reset, closed mid-reply
            raise TritonUnavailable(
                f"Triton at {self.url} ({self.protocol}) did not answer the {what}: {exc}; "
                f"is the server running? {START_HINT}"
            ) from None
        except InferenceServerException as exc:
            raise _translate(exc, what, self.url) from None


def _translate(exc: InferenceServerException, what: str, url: str) -> Exception:
    message = str(exc.message() or exc)
    status = str(exc.status() or "")
    if RESTRICTED_MARK in message:
        return ServiceError(
            f"Triton at {url} refused the {what}: its repository API needs the server's key "
            f"({message}); set TANGRAM_TRITON_KEY to the key `tangram triton` was started with")
    if "UNAVAILABLE" in status or "failed to connect" in message.lower():
        return TritonUnavailable(
            f"Triton at {url} did not answer the {what}: {message}; is the server running? "
            f"{START_HINT}"
        )
    if REJECTED_MARK in message:
        return ValidationError("inputs", message[message.index(REJECTED_MARK) :])
    if what.startswith("inference") and status in INVALID_STATUSES:
        return ValidationError("inputs", f"Triton rejected the request: {message}")
    return ServiceError(f"Triton {what} failed: {message}")
