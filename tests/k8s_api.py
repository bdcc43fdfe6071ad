"""A fake Kubernetes API server (no cluster is reachable here): a small HTTP server speaking the
``scale`` subresource of Deployments and StatefulSets to the official ``kubernetes`` client. It
records every request, so a test can compare what the actuator asked for with the RBAC it gets."""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import kubernetes

SCALE_PATH = re.compile(
    r"^/apis/apps/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>deployments|statefulsets)/"
    r"(?P<name>[^/]+)/scale$")


class FakeApiServer(ThreadingHTTPServer):
    """Replicas per (kind, namespace, name), and every PATCH body received."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), ScaleHandler)
        self.replicas: dict[tuple[str, str, str], int] = {}
        self.patches: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str]] = []


class ScaleHandler(BaseHTTPRequestHandler):
    """GET and PATCH of ``.../{deployments,statefulsets}/{name}/scale``."""

    server: FakeApiServer

    def do_GET(self) -> None:
        self._answer(None)

    def do_PATCH(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        self._answer(json.loads(self.rfile.read(length)))

    def log_message(self, *_: Any) -> None:
        """Quiet."""

    def _answer(self, patch: dict[str, Any] | None) -> None:
        self.server.requests.append((self.command, self.path.split("?")[0]))
        match = SCALE_PATH.match(self.path.split("?")[0])
        key = (match["kind"], match["ns"], match["name"]) if match else None
        if key is None or key not in self.server.replicas:
            self._send(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
            return
        if patch is not None:
            self.server.patches.append(patch)
            self.server.replicas[key] = int(patch["spec"]["replicas"])
        replicas = self.server.replicas[key]
        self._send(200, {"apiVersion": "autoscaling/v1", "kind": "Scale",
                         "metadata": {"name": key[2], "namespace": key[1]},
                         "spec": {"replicas": replicas}, "status": {"replicas": replicas}})

    def _send(self, code: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


@contextlib.contextmanager
def running_api_server() -> Iterator[FakeApiServer]:
    """A :class:`FakeApiServer` serving from a thread on a free loopback port."""
    server = FakeApiServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def apps_api(server: FakeApiServer) -> Any:
    """The official client's ``AppsV1Api`` pointed at ``server``."""
    config = kubernetes.client.Configuration(host=f"http://127.0.0.1:{server.server_port}")
    return kubernetes.client.AppsV1Api(kubernetes.client.ApiClient(config))
