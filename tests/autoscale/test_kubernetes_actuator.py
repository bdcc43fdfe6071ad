"""The Kubernetes actuator with the official client against a fake API server (no cluster is
reachable here): a small HTTP server speaking the ``scale`` subresource of Deployments and
StatefulSets."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import redis

from tangram_celery import keys
from tangram_celery.autoscale.actuators import KubernetesActuator, NodeDrain, Workload

kubernetes = pytest.importorskip("kubernetes")

SCALE_PATH = re.compile(
    r"^/apis/apps/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>deployments|statefulsets)/"
    r"(?P<name>[^/]+)/scale$")


class FakeApiServer(ThreadingHTTPServer):
    """Replicas per (kind, namespace, name), and every PATCH body received."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), ScaleHandler)
        self.replicas: dict[tuple[str, str, str], int] = {}
        self.patches: list[dict[str, Any]] = []


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


@pytest.fixture()
def api_server() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def apps_api(server: FakeApiServer) -> Any:
    config = kubernetes.client.Configuration(host=f"http://127.0.0.1:{server.server_port}")
    return kubernetes.client.AppsV1Api(kubernetes.client.ApiClient(config))


def test_deployment_scaled_through_the_scale_subresource(api_server: FakeApiServer) -> None:
    api_server.replicas[("deployments", "rl", "reward")] = 1
    actuator = KubernetesActuator(apps_api(api_server), {"gpu/rm": Workload("deployment",
                                                                            "reward", "rl")})
    assert actuator.sizes() == {"gpu/rm": 1}
    actuator.scale("gpu/rm", 3)
    assert actuator.sizes() == {"gpu/rm": 3}
    actuator.scale("gpu/rm", 2)
    assert api_server.patches == [{"spec": {"replicas": 3}}, {"spec": {"replicas": 2}}]


def test_statefulset_shrinks_only_after_its_tail_is_drained(
    api_server: FakeApiServer, redis_client: redis.Redis
) -> None:
    api_server.replicas[("statefulsets", "rl", "cpu")] = 3
    for i in range(3):
        redis_client.hset(keys.node(f"cpu-{i}"), mapping={"cores": 4, "free_cores": 4,
                                                           "memory_mb": 8192})
    redis_client.sadd(keys.node_trajectories("cpu-2"), "traj")
    actuator = KubernetesActuator(apps_api(api_server), {"cpu": Workload("statefulset", "cpu",
                                                                         "rl")},
                                  drain=NodeDrain(redis_client), node_memory_mb=8192)
    actuator.scale("cpu", 1)
    assert actuator.sizes() == {"cpu": 1} and api_server.patches == []
    assert redis_client.hget(keys.node("cpu-2"), "memory_mb") == b"0"
    actuator.step()
    assert api_server.patches == [], "patched before cpu-2's trajectory ended"
    actuator.scale("cpu", 2)
    assert redis_client.hget(keys.node("cpu-1"), "memory_mb") == b"8192"
    redis_client.srem(keys.node_trajectories("cpu-2"), "traj")
    actuator.step()
    assert api_server.patches == [{"spec": {"replicas": 2}}]
    assert api_server.replicas[("statefulsets", "rl", "cpu")] == 2
