"""The Kubernetes actuator: pools as Deployments or StatefulSets, the path to many hosts."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tangram_celery.autoscale.actuators.members import NodeDrain
from tangram_celery.errors import ConfigError, ServiceError
from tangram_celery.settings import AutoscaleSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Workload:
    """A Kubernetes workload running one pool's members: ``kind`` is ``deployment`` or
    ``statefulset``."""

    kind: str
    name: str
    namespace: str = "default"

    @classmethod
    def from_settings(cls, autoscale: AutoscaleSettings) -> Workload:
        """The CPU node workload: ``TANGRAM_KUBERNETES_CPU_WORKLOAD`` (``kind/name``) in
        ``TANGRAM_KUBERNETES_NAMESPACE``."""
        kind, _, name = autoscale.kubernetes_cpu_workload.partition("/")
        return cls(kind, name, autoscale.kubernetes_namespace)


def cluster_apps_api() -> Any:
    """The ``AppsV1Api`` of the cluster this runs in (its pod's service account), else of the
    current ``kubeconfig`` context. Raises :class:`ConfigError` when neither is there."""
    try:
        from kubernetes import client, config
    except ImportError:
        raise ConfigError("the Kubernetes actuator needs the kubernetes client: "
                          "pip install 'tangram-celery[k8s]'") from None
    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError) as exc:
            raise ConfigError(
                f"TANGRAM_AUTOSCALE_ACTUATOR=kubernetes: not in a pod and no usable kubeconfig "
                f"({exc}); run the autoscaler in the cluster (deploy/k8s) or set KUBECONFIG"
            ) from None
    return client.AppsV1Api()


class KubernetesActuator:
    """Pools as Kubernetes Deployments or StatefulSets, scaled through their ``scale``
    subresource with the official ``kubernetes`` client: the path to many hosts.

    A pool's size is its ``spec.replicas``. Growing patches it at once. For a CPU pool on a
    **StatefulSet** whose pods run ``tangram worker cpu --node $(POD_NAME)`` (pod ``<name>-<i>``
    is node ``<name>-<i>``), shrinking first drains the nodes Kubernetes will remove (the highest
    ordinals) and patches the replicas down only once they are drained (or after
    ``drain_timeout_s``), so no pinned trajectory loses its environment. A Deployment removes
    pods of its own choosing: it is patched at once, and its pods need a ``preStop`` hook and a
    long ``terminationGracePeriodSeconds`` instead.
    """

    def __init__(
        self, apps_api: Any, workloads: Mapping[str, Workload], drain: NodeDrain | None = None,
        node_memory_mb: float = 8192.0, drain_timeout_s: float = 600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._apps = apps_api
        self.node_memory_mb = node_memory_mb
        self.workloads = dict(workloads)
        self._drain = drain
        self.drain_timeout_s = drain_timeout_s
        self._clock = clock
        self._pending: dict[str, tuple[int, float]] = {}

    def sizes(self) -> dict[str, int]:
        """``spec.replicas`` of every pool's workload (less the replicas being drained)."""
        return {pool: self._pending[pool][0] if pool in self._pending else self._replicas(pool)
                for pool in self.workloads}

    def scale(self, pool: str, target: int) -> None:
        """Patch the replicas (growing, or a Deployment), else start draining the tail."""
        workload = self.workloads.get(pool)
        if workload is None:
            log.warning("no Kubernetes workload for pool %s; ignored", pool)
            return
        current = self._replicas(pool)
        if pool in self._pending:
            self._cancel_drains(workload, self._pending.pop(pool)[0], min(current, target))
        if target >= current or workload.kind != "statefulset" or self._drain is None:
            self._patch(pool, target)
            return
        for ordinal in range(target, current):
            self._drain.begin(f"{workload.name}-{ordinal}")
        self._pending[pool] = (target, self._clock())

    def step(self) -> None:
        """Patch a StatefulSet down once the nodes it will remove are drained."""
        for pool, (target, since) in list(self._pending.items()):
            workload = self.workloads[pool]
            tail = [f"{workload.name}-{i}" for i in range(target, self._replicas(pool))]
            late = self._clock() - since > self.drain_timeout_s
            if late or all(self._drain is not None and self._drain.done(n) for n in tail):
                self._patch(pool, target)
                del self._pending[pool]

    def close(self) -> None:
        """Nothing to stop: the workloads stay as they are."""

    def _cancel_drains(self, workload: Workload, low: int, high: int) -> None:
        for ordinal in range(low, high):
            if self._drain is not None:
                self._drain.cancel(f"{workload.name}-{ordinal}", self.node_memory_mb)

    def _replicas(self, pool: str) -> int:
        workload = self.workloads[pool]
        read = (self._apps.read_namespaced_stateful_set_scale if workload.kind == "statefulset"
                else self._apps.read_namespaced_deployment_scale)
        with api_errors("get", workload):
            return int(read(workload.name, workload.namespace).spec.replicas or 0)

    def _patch(self, pool: str, replicas: int) -> None:
        workload = self.workloads[pool]
        patch = (self._apps.patch_namespaced_stateful_set_scale
                 if workload.kind == "statefulset"
                 else self._apps.patch_namespaced_deployment_scale)
        with api_errors("patch", workload):
            patch(workload.name, workload.namespace, {"spec": {"replicas": replicas}})
        log.info("patched %s/%s replicas to %d", workload.kind, workload.name, replicas)


@contextlib.contextmanager
def api_errors(verb: str, workload: Workload) -> Iterator[None]:
    """Turn the client's API and connection errors into :class:`ServiceError` naming the call
    (a 403 is the Role, a 404 the workload's name or namespace)."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        yield
    except ApiException as exc:
        raise ServiceError(
            f"Kubernetes API: {verb} {workload.kind}s/{workload.name}/scale in namespace "
            f"{workload.namespace}: {exc.status} {exc.reason}; check "
            "TANGRAM_KUBERNETES_CPU_WORKLOAD, TANGRAM_KUBERNETES_NAMESPACE and the autoscaler's "
            "Role (deploy/k8s/autoscaler.yaml)") from None
    except (HTTPError, OSError) as exc:
        raise ServiceError(f"Kubernetes API unreachable ({verb} {workload.kind}s/"
                           f"{workload.name}/scale): {exc}") from None
