"""deploy/k8s as data: every manifest loaded into the ``kubernetes`` client's typed models, and
each container's environment resolved the way the kubelet resolves it (ConfigMap, Secret, the
downward API, ``$(VAR)`` references), so tests can hand it to ``Settings.from_env``."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
SECRET = "tangram-credentials"
REFERENCE = re.compile(r"\$\((?P<name>[A-Za-z_][A-Za-z0-9_]*)\)")


@dataclass(frozen=True)
class _Response:
    """What ``ApiClient.deserialize`` reads from an HTTP response: its body."""

    data: str


def kustomization() -> dict[str, Any]:
    """deploy/k8s/kustomization.yaml as a mapping."""
    loaded: dict[str, Any] = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    return loaded


def documents(name: str) -> list[dict[str, Any]]:
    """The YAML documents of one manifest file."""
    return [doc for doc in yaml.safe_load_all((K8S / name).read_text()) if doc]


def model_type(doc: Mapping[str, Any]) -> str:
    """The client's model class of a manifest: ``apps/v1`` ``Deployment`` is ``V1Deployment``."""
    version = str(doc["apiVersion"]).rsplit("/", 1)[-1]
    return version[0].upper() + version[1:] + str(doc["kind"])


def typed(doc: Mapping[str, Any]) -> Any:
    """The manifest as the client's typed model (``ApiClient.deserialize``, as for a response)."""
    client = kubernetes.client.ApiClient()
    return client.deserialize(_Response(json.dumps(doc)), model_type(doc))


def round_trip(doc: Mapping[str, Any]) -> Any:
    """The typed model serialized again: equal to ``doc`` unless a field was unknown to the
    model (a typo, a wrong nesting), which the client drops silently."""
    return kubernetes.client.ApiClient().sanitize_for_serialization(typed(doc))


@cache
def objects(names: tuple[str, ...] | None = None) -> tuple[Any, ...]:
    """Typed models of every document of the kustomization's resources (or of ``names``)."""
    files = names if names is not None else tuple(kustomization()["resources"])
    return tuple(typed(doc) for name in files for doc in documents(name))


def of_kind(kind: str) -> list[Any]:
    """The kustomization's objects of one kind."""
    return [o for o in objects() if o.kind == kind]


def named(kind: str, name: str) -> Any:
    """The one object of ``kind`` called ``name``."""
    found = [o for o in of_kind(kind) if o.metadata.name == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def workloads() -> list[Any]:
    """Deployments and StatefulSets."""
    return of_kind("Deployment") + of_kind("StatefulSet")


def containers() -> Iterator[tuple[Any, Any]]:
    """(workload, container) of every container of every workload."""
    for workload in workloads():
        for container in workload.spec.template.spec.containers:
            yield workload, container


def container(workload: str, name: str) -> Any:
    """One container of the named Deployment or StatefulSet."""
    for owner, item in containers():
        if owner.metadata.name == workload and item.name == name:
            return item
    raise AssertionError(f"no container {name} in {workload}")


def secret_keys() -> dict[str, str]:
    """tangram-credentials' keys and example values (secrets.env.example, which the
    kustomization's secretGenerator reads as secrets.env)."""
    pairs = (line.split("=", 1) for line in
             (K8S / "secrets.env.example").read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def config_map(name: str) -> dict[str, str]:
    """The data of one ConfigMap of the kustomization."""
    return dict(named("ConfigMap", name).data or {})


def resolved_env(workload: Any, item: Any) -> dict[str, str]:
    """The container's environment as the kubelet builds it (pod ordinal 0)."""
    env: dict[str, str] = {}
    for source in item.env_from or ():
        assert source.config_map_ref is not None, f"{item.name}: only ConfigMaps in envFrom"
        env.update(config_map(source.config_map_ref.name))
    for var in item.env or ():
        env[var.name] = _value(workload, var, env)
    return env


def expand(text: str, env: Mapping[str, str]) -> str:
    """``$(VAR)`` references replaced by earlier variables, as in ``args`` and ``env``."""
    return REFERENCE.sub(lambda m: env.get(m["name"], m[0]), text)


def _value(workload: Any, var: Any, env: Mapping[str, str]) -> str:
    if var.value_from is None:
        return expand(var.value or "", env)
    source = var.value_from
    if source.secret_key_ref is not None:
        ref = source.secret_key_ref
        assert ref.name == SECRET, f"{var.name}: secret {ref.name}, expected {SECRET}"
        assert ref.key in secret_keys(), f"{var.name}: key {ref.key} not in secrets.env.example"
        return secret_keys()[ref.key]
    path = source.field_ref.field_path
    values = {"metadata.name": f"{workload.metadata.name}-0",
              "metadata.namespace": kustomization()["namespace"]}
    assert path in values, f"{var.name}: unexpected fieldRef {path}"
    return values[path]
