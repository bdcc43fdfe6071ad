"""deploy/k8s against the code it runs: every manifest loads into the ``kubernetes`` client's
typed models without losing a field; every container's command is one the ``tangram`` parser
accepts; every ``TANGRAM_`` variable is a real setting that ``Settings.from_env`` accepts; ports,
addresses and Services line up; the autoscaler's Role grants exactly the calls its actuator makes
on the CPU node StatefulSet (no cluster here: a fake API server answers the real client)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest
import yaml
from k8s_api import apps_api, running_api_server
from k8s_manifests import (
    K8S,
    ROOT,
    SECRET,
    container,
    containers,
    documents,
    expand,
    kustomization,
    named,
    objects,
    of_kind,
    resolved_env,
    round_trip,
    workloads,
)

from tangram_celery.autoscale.actuators import KubernetesActuator, Workload
from tangram_celery.autoscale.actuators.interface import CPU_POOL
from tangram_celery.cli import build_parser
from tangram_celery.settings import PREFIX, VARIABLES, Settings, variable
from tangram_celery.stack.broker import server_argv

PENDING: dict[str, str] = {}
"""Manifest files not yet in the kustomization's resources, and why."""
SETTINGS = {variable(key) for key in VARIABLES}


def manifest_files() -> list[str]:
    return sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


@pytest.mark.parametrize("name", manifest_files())
def test_every_manifest_loads_into_typed_models_without_losing_a_field(name: str) -> None:
    for doc in documents(name):
        assert round_trip(doc) == doc, f"{name}: {doc['kind']} has fields the model does not know"


def test_the_round_trip_catches_a_misspelled_field() -> None:
    doc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
           "spec": {"selectr": {"a": "b"}}}
    assert round_trip(doc) != doc


def test_every_manifest_is_applied_or_named_pending() -> None:
    listed = set(kustomization()["resources"])
    assert listed | set(PENDING) == set(manifest_files())
    assert not listed & set(PENDING)


def test_names_are_unique_and_workloads_select_their_pods() -> None:
    seen = [(o.kind, o.metadata.name) for o in objects()]
    assert len(seen) == len(set(seen))
    for workload in workloads():
        labels = workload.spec.template.metadata.labels
        assert labels == workload.spec.selector.match_labels
        assert labels["app.kubernetes.io/name"] == workload.metadata.name
    for service in of_kind("Service"):
        pods = [w for w in workloads()
                if service.spec.selector.items() <= w.spec.template.metadata.labels.items()]
        assert pods, f"Service {service.metadata.name} selects no workload"
        ports = {p.name: p.container_port for w in pods for c in w.spec.template.spec.containers
                 for p in c.ports or ()}
        for port in service.spec.ports or ():
            assert port.target_port in ports and ports[port.target_port] == port.port


def test_every_container_runs_the_image_compose_builds() -> None:
    compose = yaml.safe_load((ROOT / "compose" / "docker-compose.yml").read_text())
    default = re.fullmatch(r"\$\{STACK_IMAGE:-(?P<image>[^}]+)\}",
                           compose["x-tangram-service"]["image"])
    assert default is not None
    assert {c.image for _, c in containers()} == {default["image"]}


@pytest.mark.parametrize("workload,name", [(w.metadata.name, c.name) for w, c in containers()])
def test_each_container_runs_a_real_tangram_command(workload: str, name: str) -> None:
    item = container(workload, name)
    assert item.command == ["tangram"]
    owner = named_workload(workload)
    env = resolved_env(owner, item)
    commands = [[expand(a, env) for a in item.args]]
    commands += [probe._exec.command[1:] for probe in (item.readiness_probe, item.liveness_probe)
                 if probe is not None and probe._exec is not None]
    for argv in commands:
        try:
            build_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"{workload}/{name}: `tangram {' '.join(argv)}` is refused by cli.py")


@pytest.mark.parametrize("workload,name", [(w.metadata.name, c.name) for w, c in containers()])
def test_each_tangram_variable_is_a_setting_that_parses(workload: str, name: str) -> None:
    env = resolved_env(named_workload(workload), container(workload, name))
    unknown = sorted(k for k in env if k.startswith(PREFIX) and k not in SETTINGS)
    assert not unknown, f"{workload}/{name}: {unknown} are not Settings fields"
    Settings.from_env(env)


def test_servers_listen_on_their_settings_default_ports_with_credentials() -> None:
    defaults = Settings().observe
    for workload, port, secret in (("tangram-flower", defaults.flower_port, "flower-password"),
                                   ("tangram-dashboard", defaults.dashboard_port,
                                    "dashboard-password"),
                                   ("tangram-exporter", defaults.exporter_port,
                                    "exporter-password")):
        item = named_workload(workload).spec.template.spec.containers[0]
        args = build_parser().parse_args(item.args)
        assert args.port == port and args.address == "0.0.0.0"
        assert [p.container_port for p in item.ports] == [port]
        if secret is not None:
            refs = {v.value_from.secret_key_ref.key for v in item.env if v.value_from
                    and v.value_from.secret_key_ref}
            assert secret in refs, f"{workload} must take its password from {SECRET}"


def test_every_service_address_in_a_setting_reaches_a_listener() -> None:
    services = {s.metadata.name: {p.port for p in s.spec.ports or ()} for s in of_kind("Service")}
    for owner, item in containers():
        env = resolved_env(owner, item)
        pod_ports = {p.container_port for c in owner.spec.template.spec.containers
                     for p in c.ports or ()} | set(_listening(owner))
        for var in ("TANGRAM_REDIS_URL", "TANGRAM_TRITON_URL"):
            if var not in env:
                continue
            url = urlsplit(env[var])
            where = pod_ports if url.hostname == "127.0.0.1" else services.get(url.hostname, set())
            assert url.port in where, f"{owner.metadata.name}/{item.name}: {var} reaches nothing"
            if var == "TANGRAM_REDIS_URL":
                assert url.password, f"{owner.metadata.name}/{item.name}: Redis without password"


def test_redis_keeps_its_append_only_file_on_a_persistent_volume() -> None:
    redis_set = named("StatefulSet", "tangram-redis")
    item = redis_set.spec.template.spec.containers[0]
    args = build_parser().parse_args(item.args)
    argv = server_argv("redis-server", 6379, args.bind, args.dir)
    assert argv[argv.index("--appendonly") + 1] == "yes"
    claims = {c.metadata.name for c in redis_set.spec.volume_claim_templates}
    mounts = {m.mount_path: m.name for m in item.volume_mounts}
    assert mounts[str(args.dir)] in claims


def test_gpu_pool_schedules_the_gpus_its_triton_is_given() -> None:
    pool = container("tangram-gpu-pool", "pool")
    triton = container("tangram-gpu-pool", "triton")
    gpus = build_parser().parse_args(pool.args).gpus
    assert triton.resources.requests["nvidia.com/gpu"] == str(gpus)
    assert triton.resources.limits["nvidia.com/gpu"] == str(gpus)
    env = resolved_env(named_workload("tangram-gpu-pool"), pool)
    assert not Settings.from_env(env).gpu.simulated
    http_port = build_parser().parse_args(triton.args).http_port
    assert urlsplit(env["TANGRAM_TRITON_URL"]).port == http_port
    triton_env = resolved_env(named_workload("tangram-gpu-pool"), triton)
    for item in (pool, triton):
        refs = {v.name: v.value_from.secret_key_ref.key for v in item.env
                if v.value_from and v.value_from.secret_key_ref}
        assert refs.get("TANGRAM_TRITON_KEY") == "triton-key", f"{item.name}: key from {SECRET}"
    assert Settings.from_env(triton_env).triton.key == Settings.from_env(env).triton.key


def test_cpu_nodes_are_what_the_autoscaler_thinks_it_scales() -> None:
    settings = autoscaler_settings()
    workload = Workload.from_settings(settings.autoscale)
    assert workload.kind == "statefulset"
    nodes = named("StatefulSet", workload.name)
    item = nodes.spec.template.spec.containers[0]
    env = resolved_env(nodes, item)
    args = build_parser().parse_args([expand(a, env) for a in item.args])
    assert args.node == f"{workload.name}-0", "node names must be pod names for the drain"
    assert args.cores == settings.autoscale.node_cores
    assert item.resources.requests["cpu"] == str(args.cores)
    assert args.memory_mb == settings.autoscale.node_memory_mb
    assert settings.autoscale.kubernetes_namespace == kustomization()["namespace"]


def test_the_autoscaler_role_grants_exactly_what_its_actuator_calls() -> None:
    settings = autoscaler_settings()
    workload = Workload.from_settings(settings.autoscale)
    with running_api_server() as server:
        server.replicas[(f"{workload.kind}s", workload.namespace, workload.name)] = 1
        actuator = KubernetesActuator(apps_api(server), {CPU_POOL: workload})
        actuator.scale(CPU_POOL, 3)
        actuator.scale(CPU_POOL, 2)
        assert actuator.sizes() == {CPU_POOL: 2}
        called = {(verb_of(method), path) for method, path in server.requests}
    prefix = f"/apis/apps/v1/namespaces/{workload.namespace}/"
    granted = {(verb, f"{prefix}{resource.split('/')[0]}/{name}/{resource.split('/')[1]}")
               for rule in named("Role", "tangram-autoscaler").rules
               if rule.api_groups == ["apps"]
               for resource in rule.resources for name in rule.resource_names
               for verb in rule.verbs}
    assert called == granted
    binding = named("RoleBinding", "tangram-autoscaler")
    account = named("Deployment", "tangram-autoscaler").spec.template.spec.service_account_name
    assert binding.role_ref.name == "tangram-autoscaler" and binding.role_ref.kind == "Role"
    assert [(s.kind, s.name, s.namespace) for s in binding.subjects] == [
        ("ServiceAccount", account, kustomization()["namespace"])]
    assert named("ServiceAccount", account)


def named_workload(name: str) -> object:
    return next(w for w in workloads() if w.metadata.name == name)


def autoscaler_settings() -> Settings:
    autoscaler = named("Deployment", "tangram-autoscaler")
    settings = Settings.from_env(resolved_env(autoscaler,
                                              autoscaler.spec.template.spec.containers[0]))
    assert settings.autoscale.actuator == "kubernetes"
    return settings


def verb_of(method: str) -> str:
    return {"GET": "get", "PATCH": "patch"}[method]


def _listening(owner: object) -> list[int]:
    """Ports a pod's containers listen on without declaring them (``tangram triton``)."""
    ports = []
    for item in owner.spec.template.spec.containers:  # type: ignore[attr-defined]
        if item.args and item.args[0] == "triton":
            ports.append(build_parser().parse_args(item.args).http_port)
    return ports
