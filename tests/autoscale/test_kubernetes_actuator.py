"""The Kubernetes actuator with the official client against a fake API server (no cluster is
reachable here): a small HTTP server speaking the ``scale`` subresource of Deployments and
StatefulSets."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis
from k8s_api import FakeApiServer, apps_api, running_api_server

from tangram_celery import keys
from tangram_celery.autoscale.actuators import KubernetesActuator, NodeDrain, Workload
from tangram_celery.autoscale.controller import kubernetes_controller, options_from_settings
from tangram_celery.errors import ConfigError, ServiceError
from tangram_celery.settings import Settings


@pytest.fixture()
def api_server() -> Iterator[FakeApiServer]:
    with running_api_server() as server:
        yield server


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


def test_autoscaler_on_kubernetes_scales_the_workload_its_settings_name(
    api_server: FakeApiServer, settings: Settings, redis_client: redis.Redis
) -> None:
    chosen = settings.with_(autoscale_actuator="kubernetes", kubernetes_namespace="rl",
                            kubernetes_cpu_workload="statefulset/nodes", autoscale_min_nodes=2)
    api_server.replicas[("statefulsets", "rl", "nodes")] = 0
    controller = kubernetes_controller(chosen, options_from_settings(chosen.autoscale),
                                       apps_api(api_server))
    decision = controller.tick()
    assert [(t.pool, t.target) for t in decision.targets] == [("cpu", 2)]
    assert api_server.patches == [{"spec": {"replicas": 2}}]
    assert redis_client.hget(keys.autoscale_pool("cpu"), "target") == b"2"


@pytest.mark.parametrize("changes,error", [
    ({"autoscale_actuator": "nomad"}, "TANGRAM_AUTOSCALE_ACTUATOR"),
    ({"kubernetes_cpu_workload": "daemonset/x"}, "TANGRAM_KUBERNETES_CPU_WORKLOAD"),
    ({"kubernetes_cpu_workload": "statefulset/"}, "TANGRAM_KUBERNETES_CPU_WORKLOAD"),
])
def test_kubernetes_settings_are_checked(changes: dict[str, str], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        Settings().with_(**changes)
    assert Workload.from_settings(Settings().autoscale) == Workload(
        "statefulset", "tangram-cpu-node", "tangram")


def test_api_errors_name_the_call_and_the_loop_goes_on(
    api_server: FakeApiServer, settings: Settings, redis_client: redis.Redis
) -> None:
    missing = settings.with_(autoscale_actuator="kubernetes", kubernetes_namespace="rl",
                             kubernetes_cpu_workload="statefulset/absent",
                             autoscale_interval_s=0.05)
    controller = kubernetes_controller(missing, options_from_settings(missing.autoscale),
                                       apps_api(api_server))
    with pytest.raises(ServiceError, match=r"get statefulsets/absent/scale in namespace rl: 404"):
        controller.tick()
    stop = threading.Event()

    def stop_after_three_calls() -> None:
        deadline = time.monotonic() + 60
        while len(api_server.requests) <= 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        stop.set()

    watcher = threading.Thread(target=stop_after_three_calls)
    watcher.start()
    controller.run(stop)
    watcher.join()
    assert len(api_server.requests) > 2, "the loop kept ticking through the errors"
