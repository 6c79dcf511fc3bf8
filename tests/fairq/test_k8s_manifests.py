"""deploy/k8s: every overlay renders, validates offline and deploys a working fairq.

Each overlay is rendered with ``kubectl kustomize`` where kubectl is installed, else
with the Python renderer of test_k8s_kustomize.py (which a test there checks against
kubectl). Built-in kinds are validated against the Kubernetes OpenAPI schemas that
the kubernetes-validate package bundles (strict: unknown fields fail), for the oldest
and newest Kubernetes we claim. The CRDs (KEDA, Prometheus Operator) have no bundled
schema: they are checked against the minimal JSON schemas below (the fields we use
and their types), not against the operators' full CRDs.
"""

from __future__ import annotations

import base64
import copy
import fnmatch
import os
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from dockerfile_parse import DockerfileParser
from pydantic import BaseModel

from broker import keys
from broker.settings import Settings, load_settings
from fairq.cli import main as fairq_cli
from fairq.config_check import check_file
from fairq.k8s import render as k8s
from tests.support.kustomize import (
    K8S_DIR,
    OVERLAYS,
    has_kubectl,
    kubectl_kustomize,
    kustomize,
    operator_k8s_dir,
)

ROOT = K8S_DIR.parent.parent
KUBERNETES_VERSIONS = ("1.29.0", "1.37.0")  # oldest supported (docs/operations.md), newest
Obj = dict[str, Any]


@cache
def _render(overlay: str) -> tuple[Obj, ...]:
    """The overlay as an operator applies it: from a checkout with their secrets written."""
    path = operator_k8s_dir() / "overlays" / overlay
    return tuple(kubectl_kustomize(path) if has_kubectl() else kustomize(path))


def rendered(overlay: str) -> list[Obj]:
    return copy.deepcopy(list(_render(overlay)))


def of_kind(objects: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def named(objects: list[Obj], kind: str, name: str) -> Obj:
    return next(o for o in of_kind(objects, kind) if o["metadata"]["name"] == name)


def pod_specs(objects: list[Obj]) -> list[tuple[Obj, Obj]]:
    return [
        (o, o["spec"]["template"]["spec"])
        for o in objects
        if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet")
    ]


def fairq_containers(objects: list[Obj]) -> list[tuple[Obj, Obj, Obj]]:
    """(workload, pod spec, container) of every container running the fairq image."""
    return [
        (workload, pod, container)
        for workload, pod in pod_specs(objects)
        for container in pod["containers"]
        if container["image"].split(":")[0].rsplit("/", 1)[-1] == "fairq"
    ]


def source_models() -> list[str]:
    return [m.name for m in k8s.load_source(K8S_DIR / "fairq.yaml")[1]]


# -- the generated files ----------------------------------------------------------------


def test_generated_files_match_a_fresh_render_of_fairq_yaml() -> None:
    assert k8s.stale(K8S_DIR) == [], "run `fairq k8s render` and commit the result"


def test_the_rendered_configuration_names_each_models_engine_and_needs_no_note() -> None:
    # The old form (engine settings on the model) loads too, but with a note at every
    # start of every pod: the rendered file is in the form the settings ask for.
    settings, problems = check_file(K8S_DIR / "base" / "fairq.yaml")
    assert settings is not None and problems == []
    assert settings.notes == ()
    source = yaml.safe_load((K8S_DIR / "fairq.yaml").read_text())
    llama = settings.model(source["models"][0]["name"])
    assert llama is not None and llama.policy == "token_fair"
    assert llama.tpot_ceiling_ms == source["models"][0]["tpot_ceiling_ms"]
    assert llama.discovery is not None and llama.discovery.dns.startswith("engine-llama")


def test_render_refuses_an_engines_section_saying_where_engine_settings_go(
    tmp_path: Path,
) -> None:
    source = yaml.safe_load((K8S_DIR / "fairq.yaml").read_text())
    source["engines"] = [{"name": "gpu-a", "endpoints": ["http://gpu-a:8000"]}]
    (tmp_path / "fairq.yaml").write_text(yaml.safe_dump(source))
    with pytest.raises(ValueError, match="move them onto the model entries"):
        k8s.render(tmp_path)


def test_render_writes_one_engine_file_per_model_and_drops_a_removed_one(tmp_path: Path) -> None:
    source = yaml.safe_load((K8S_DIR / "fairq.yaml").read_text())
    new_model = {"name": "org/New-Model:v2", "k8s": {"min_replicas": 0, "max_replicas": 3}}
    source["models"].append(new_model)
    (tmp_path / "fairq.yaml").write_text(yaml.safe_dump(source))
    (tmp_path / "engines" / "vllm").mkdir(parents=True)
    (tmp_path / "engines" / "vllm" / "gone.yaml").write_text("{}\n")
    k8s.write(tmp_path)
    new = yaml.safe_load_all((tmp_path / "engines/vllm/org-new-model-v2.yaml").read_text())
    names = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in new)
    assert names == ["Deployment/engine-org-new-model-v2", "Service/engine-org-new-model-v2"]
    assert not (tmp_path / "engines/vllm/gone.yaml").exists()
    config = yaml.safe_load((tmp_path / "base/fairq.yaml").read_text())
    engine = _engine_of(config, config["models"][-1])
    assert "endpoints" not in engine
    assert engine["discovery"] == {
        "dns": "engine-org-new-model-v2.fairq.svc.cluster.local", "port": 8000,
        "scheme": "http", "interval_s": 5.0,
    }  # fmt: skip
    scaled = yaml.safe_load_all(
        (tmp_path / "components/engine-scaling/scaledobjects.yaml").read_text()
    )
    mine = next(o for o in scaled if o["metadata"]["name"] == "engine-org-new-model-v2")
    assert (mine["spec"]["minReplicaCount"], mine["spec"]["maxReplicaCount"]) == (0, 3)


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ({"pods": 2}, "k8s.pods is gone: .* set k8s.min_replicas and k8s.max_replicas"),
        ({"min_replicas": 3, "max_replicas": 2}, r"min_replicas \(3\) is above"),
        ({"min_replicas": -1}, "min_replicas"),
    ],
)
def test_render_refuses_replica_bounds_it_cannot_keep(
    tmp_path: Path, engine: Obj, message: str
) -> None:
    (tmp_path / "fairq.yaml").write_text(yaml.safe_dump({"models": [{"name": "m", "k8s": engine}]}))
    with pytest.raises(ValueError, match=message):
        k8s.render(tmp_path)


def test_render_refuses_a_model_that_lists_its_endpoints(tmp_path: Path) -> None:
    model = {"name": "m", "endpoints": ["http://somewhere:8000"]}
    (tmp_path / "fairq.yaml").write_text(yaml.safe_dump({"models": [model]}))
    with pytest.raises(ValueError, match="found by DNS"):
        k8s.render(tmp_path)


def test_render_rejects_two_models_with_the_same_kubernetes_name(tmp_path: Path) -> None:
    (tmp_path / "fairq.yaml").write_text(
        yaml.safe_dump({"models": [{"name": "a.b"}, {"name": "a-b"}]})
    )
    with pytest.raises(ValueError, match="same Kubernetes name"):
        k8s.render(tmp_path)


def test_render_rejects_an_invalid_fairq_model_entry(tmp_path: Path) -> None:
    (tmp_path / "fairq.yaml").write_text(
        yaml.safe_dump({"models": [{"name": "m", "policy": "lottery"}]})
    )
    with pytest.raises(ValueError, match="policy"):
        k8s.render(tmp_path)


# -- schemas ----------------------------------------------------------------------------

_STR = {"type": "string", "minLength": 1}
_SELECTOR = {"type": "object", "required": ["matchLabels"],
             "properties": {"matchLabels": {"type": "object"}}}  # fmt: skip
_META = {"type": "object", "required": ["name", "namespace"],
         "properties": {"name": _STR, "namespace": _STR}}  # fmt: skip


def _crd(api_version: str, spec: Obj) -> Obj:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {"apiVersion": {"const": api_version}, "metadata": _META, "spec": spec},
    }


CRD_SCHEMAS = {
    "ScaledObject": _crd("keda.sh/v1alpha1", {
        "type": "object",
        "required": ["scaleTargetRef", "triggers"],
        "properties": {
            "scaleTargetRef": {"type": "object", "required": ["name"],
                               "properties": {"name": _STR}},
            "minReplicaCount": {"type": "integer", "minimum": 0},
            "maxReplicaCount": {"type": "integer", "minimum": 1},
            "pollingInterval": {"type": "integer", "minimum": 1},
            "cooldownPeriod": {"type": "integer", "minimum": 0},
            "advanced": {"type": "object", "additionalProperties": False, "properties": {
                "scalingModifiers": {
                    "type": "object", "required": ["formula", "target"],
                    "properties": {"formula": _STR, "target": _STR,
                                   "metricType": {"enum": ["AverageValue", "Value"]}},
                    "additionalProperties": False},
                # KEDA passes behavior to its HPA as it is: validate() checks it against
                # autoscaling/v2's own schema.
                "horizontalPodAutoscalerConfig": {
                    "type": "object", "additionalProperties": False,
                    "properties": {"name": _STR, "behavior": {"type": "object"}}}}},
            "triggers": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["type", "metadata"],
                "properties": {
                    "type": _STR, "name": _STR,
                    "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                    "metadata": {"type": "object",
                                 "additionalProperties": {"type": "string"}},
                    "authenticationRef": {"type": "object", "required": ["name"]}},
                "allOf": [
                    # The prometheus scaler's fields (kedacore/keda-docs, scalers/prometheus.md).
                    {"if": {"properties": {"type": {"const": "prometheus"}}},
                     "then": {"properties": {"metadata": {
                        "required": ["serverAddress", "query", "threshold"],
                        "properties": {
                            "ignoreNullValues": {"enum": ["true", "false"]},
                            "unsafeSsl": {"enum": ["true", "false"]}},
                        "propertyNames": {"enum": [
                            "serverAddress", "query", "threshold", "activationThreshold",
                            "namespace", "customHeaders", "ignoreNullValues",
                            "queryParameters", "unsafeSsl", "authModes"]}}}}},
                    # external-push (keda-docs, scalers/external-push.md; kedacore/keda,
                    # pkg/scalers/external_scaler.go): scalerAddress is host:port, the
                    # TLS switches are booleans; every other key goes to the scaler as is
                    # (ScaledObjectRef.scalerMetadata), so it is checked by the scaler.
                    {"if": {"properties": {"type": {"const": "external-push"}}},
                     "then": {"properties": {"metadata": {
                        "required": ["scalerAddress"],
                        "properties": {
                            "scalerAddress": {"type": "string", "pattern": r"^[^:/\s]+:[0-9]+$"},
                            "enableTLS": {"enum": ["true", "false"]},
                            "unsafeSsl": {"enum": ["true", "false"]}}}}}},
                ],
                "additionalProperties": False}},
        },
        "additionalProperties": False,
    }),
    "TriggerAuthentication": _crd("keda.sh/v1alpha1", {
        "type": "object",
        "properties": {"secretTargetRef": {"type": "array", "items": {
            "type": "object", "required": ["parameter", "name", "key"],
            "properties": {"parameter": _STR, "name": _STR, "key": _STR},
            "additionalProperties": False}}},
    }),
    # cert-manager's (cert-manager.io/v1; its docs, "Certificate resource", "Issuer"): the
    # fields the scaler's certificates use.
    "Issuer": _crd("cert-manager.io/v1", {
        "type": "object", "minProperties": 1, "maxProperties": 1,
        "properties": {"selfSigned": {"type": "object"},
                       "ca": {"type": "object", "required": ["secretName"],
                              "properties": {"secretName": _STR}}},
        "additionalProperties": False,
    }),
    "Certificate": _crd("cert-manager.io/v1", {
        "type": "object", "required": ["secretName", "issuerRef"],
        "properties": {
            "secretName": _STR, "commonName": _STR, "isCA": {"type": "boolean"},
            "duration": {"type": "string", "pattern": r"^[0-9]+h$"},
            "dnsNames": {"type": "array", "items": _STR},
            "usages": {"type": "array", "items": {"enum": [
                "server auth", "client auth", "digital signature", "key encipherment",
                "cert sign"]}},
            "privateKey": {"type": "object", "properties": {
                "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                "size": {"type": "integer"},
                "rotationPolicy": {"enum": ["Never", "Always"]}},
                "additionalProperties": False},
            "issuerRef": {"type": "object", "required": ["name"], "properties": {
                "name": _STR, "kind": {"enum": ["Issuer", "ClusterIssuer"]},
                "group": {"const": "cert-manager.io"}}, "additionalProperties": False}},
        "additionalProperties": False,
    }),
    "PodMonitor": _crd("monitoring.coreos.com/v1", {
        "type": "object",
        "required": ["selector", "podMetricsEndpoints"],
        "properties": {"selector": _SELECTOR, "podMetricsEndpoints": {
            "type": "array", "minItems": 1,
            "items": {"type": "object", "required": ["port"]}}},
    }),
    "ServiceMonitor": _crd("monitoring.coreos.com/v1", {
        "type": "object",
        "required": ["selector", "endpoints"],
        "properties": {"selector": _SELECTOR, "endpoints": {
            "type": "array", "minItems": 1,
            "items": {"type": "object", "required": ["port"]}}},
    }),
}  # fmt: skip


def _hpa_with(behavior: Obj) -> Obj:
    """An autoscaling/v2 HPA carrying ``behavior``, as KEDA builds its own from it."""
    return {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "keda-hpa", "namespace": "fairq"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "x"},
                 "maxReplicas": 2, "behavior": behavior},
    }  # fmt: skip


def validate(obj: Obj) -> None:
    """Raise unless ``obj`` is valid for every claimed Kubernetes version (or CRD schema)."""
    if obj["kind"] in CRD_SCHEMAS:
        jsonschema.validate(obj, CRD_SCHEMAS[obj["kind"]])
        behavior = obj["spec"].get("advanced", {}).get("horizontalPodAutoscalerConfig", {})
        if "behavior" in behavior:
            validate(_hpa_with(behavior["behavior"]))
        return
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_of_the_overlay_is_valid(overlay: str) -> None:
    objects = rendered(overlay)
    assert objects
    for obj in objects:
        try:
            validate(obj)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as exc:
            name = f"{obj['kind']}/{obj['metadata']['name']}"
            pytest.fail(f"{overlay}: {name}: {exc.message} at {list(exc.path)}")


def test_the_validation_catches_a_misspelled_field_and_a_wrong_type() -> None:
    deployment = named(rendered("production"), "Deployment", "gateway")
    validate(deployment)
    misspelled = copy.deepcopy(deployment)
    misspelled["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(misspelled)
    scaled = copy.deepcopy(named(rendered("production"), "ScaledObject", "worker"))
    scaled["spec"]["triggers"][0]["metadata"]["pendingEntriesCount"] = 48
    with pytest.raises(jsonschema.ValidationError):
        validate(scaled)
    engine = named(rendered("production"), "ScaledObject", "engine-llama-3-1-8b")
    address = engine["spec"]["triggers"][0]["metadata"]["scalerAddress"]
    for field, value in (("scalerAdress", address), ("scalerAddress", "http://" + address),
                         ("demandPerReplica", 64), ("enableTLS", "yes")):  # fmt: skip
        wrong = copy.deepcopy(engine)
        meta = wrong["spec"]["triggers"][0]["metadata"]
        if field == "scalerAdress":
            del meta["scalerAddress"]
        meta[field] = value
        with pytest.raises(jsonschema.ValidationError):
            validate(wrong)
    polled = next(
        o for o in prometheus_scaled_objects() if o["metadata"]["name"] == "engine-llama-3-1-8b"
    )
    for field, value in (("activationTreshold", "0"), ("threshold", 64)):
        wrong = copy.deepcopy(polled)
        wrong["spec"]["triggers"][0]["metadata"][field] = value
        with pytest.raises(jsonschema.ValidationError):
            validate(wrong)
    behavior = copy.deepcopy(engine)
    down = behavior["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    down["stabilizationWindow"] = 300
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(behavior)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_namespaced_object_lands_in_the_fairq_namespace(overlay: str) -> None:
    for obj in rendered(overlay):
        if obj["kind"] != "Namespace":
            assert obj["metadata"].get("namespace") == "fairq", obj["metadata"]["name"]


# -- fairq's settings -------------------------------------------------------------------


def settings_env_names() -> set[str]:
    """FAIRQ_* names pydantic-settings reads: the prefix and every field of Settings, and
    of each group of settings a field of one (``FAIRQ_HTTP__METRICS_PORT``)."""
    prefix, nested = (
        Settings.model_config["env_prefix"],
        Settings.model_config["env_nested_delimiter"],
    )
    names = {f"{prefix}{name}".upper() for name in Settings.model_fields}
    for name, field in Settings.model_fields.items():
        group = field.annotation
        if isinstance(group, type) and issubclass(group, BaseModel):
            names |= {f"{prefix}{name}{nested}{sub}".upper() for sub in group.model_fields}
    return names


def test_the_settings_names_come_from_the_model() -> None:
    names = settings_env_names()
    assert {"FAIRQ_REDIS_URL", "FAIRQ_API_KEYS", "FAIRQ_MODELS"} <= names
    assert "FAIRQ_CONFIG" not in names  # read by settings_customise_sources, checked below


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_env_var_of_a_fairq_container_is_a_real_setting(overlay: str) -> None:
    valid = settings_env_names() | {"FAIRQ_CONFIG"}
    seen = 0
    for workload, _, container in fairq_containers(rendered(overlay)):
        for env in container.get("env", []):
            seen += 1
            assert env["name"] in valid, f"{workload['metadata']['name']}: {env['name']}"
        assert "envFrom" not in container  # every name is listed, so every name is checked
    assert seen > 0


def _secret_value(objects: list[Obj], ref: Obj) -> str:
    secret = named(objects, "Secret", ref["name"])
    if ref["key"] in secret.get("stringData", {}):
        return str(secret["stringData"][ref["key"]])
    return base64.b64decode(secret["data"][ref["key"]]).decode()


def _container_env(objects: list[Obj], pod: Obj, container: Obj, root: Path) -> dict[str, str]:
    """The environment Kubernetes would give the container, with its mounted config
    files written under ``root`` (FAIRQ_CONFIG points there)."""
    mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
    for volume in pod.get("volumes", []):
        if "configMap" in volume and volume["name"] in mounts:
            data = named(objects, "ConfigMap", volume["configMap"]["name"])["data"]
            for key, text in data.items():
                target = root / mounts[volume["name"]].lstrip("/") / key
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
    env = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            env[item["name"]] = _secret_value(objects, item["valueFrom"]["secretKeyRef"])
    env["FAIRQ_CONFIG"] = str(root / env["FAIRQ_CONFIG"].lstrip("/"))
    return env


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_fairq_container_loads_valid_settings_from_its_manifests(
    overlay: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = rendered(overlay)
    services = [c for c in fairq_containers(objects) if c[2]["args"][0] != "sim"]
    assert services
    for i, (workload, pod, container) in enumerate(services):
        for name in [n for n in os.environ if n.startswith("FAIRQ_")]:
            monkeypatch.delenv(name)
        env = _container_env(objects, pod, container, tmp_path / str(i))
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        settings = load_settings()
        assert [m.name for m in settings.models] == source_models(), workload["metadata"]
        assert settings.require_redis_url().startswith(("redis://", "rediss://"))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_pod_that_exposes_metrics_serves_them_on_every_address_at_that_port(
    overlay: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fairq process serves /metrics on loopback unless told otherwise: Prometheus
    # reaches a pod only if the manifest says 0.0.0.0 and the port it declares.
    objects = rendered(overlay)
    exposed = 0
    for i, (workload, pod, container) in enumerate(fairq_containers(objects)):
        ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
        if "metrics" not in ports:
            continue
        for name in [n for n in os.environ if n.startswith("FAIRQ_")]:
            monkeypatch.delenv(name)
        for name, value in _container_env(objects, pod, container, tmp_path / str(i)).items():
            monkeypatch.setenv(name, value)
        settings = load_settings()
        # The gateway's own metrics port is http.metrics_port (its HTTP port has none then)
        port = (
            settings.http.metrics_port if container["args"][0] == "api" else settings.metrics_port
        )
        served = (settings.metrics_host, port)
        assert served == ("0.0.0.0", ports["metrics"]), workload["metadata"]["name"]
        exposed += 1
    assert exposed >= 3  # gateways, dispatchers and workers


# -- engines: one Deployment and Service per model and pod ------------------------------


def _selects(selector: Obj, labels: Obj) -> bool:
    if not selector:
        return True
    expressions = selector.get("matchExpressions", [])
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items()) and all(
        (labels.get(e["key"]) in e["values"]) == (e["operator"] == "In") for e in expressions
    )


def _engine_of(config: Obj, model: Obj) -> Obj:
    """The entry of ``engines`` that ``model`` names (each model its own)."""
    (engine,) = [e for e in config["engines"] if e["name"] == model["engine"]]
    return engine


def _config(objects: list[Obj]) -> Obj:
    (config_map,) = [c for c in of_kind(objects, "ConfigMap") if "fairq.yaml" in c["data"]]
    config: Obj = yaml.safe_load(config_map["data"]["fairq.yaml"])
    return config


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_models_discovery_names_a_headless_service_in_front_of_its_engines(
    overlay: str,
) -> None:
    objects = rendered(overlay)
    config = _config(objects)
    models = config["models"]
    assert [m["name"] for m in models] == source_models()
    for model in models:
        engine = _engine_of(config, model)
        assert "endpoints" not in engine, "found by DNS, not listed"
        found = engine["discovery"]
        host, namespace, *domain = found["dns"].split(".")
        assert (namespace, domain) == ("fairq", ["svc", "cluster", "local"])
        service = named(objects, "Service", host)
        # Headless, ready pods only: one DNS record per pod fairq may admit to.
        assert service["spec"]["clusterIP"] == "None"
        assert service["spec"]["publishNotReadyAddresses"] is False
        assert found["port"] in [p["port"] for p in service["spec"]["ports"]]
        engines = [
            (w, pod)
            for w, pod in pod_specs(objects)
            if _selects(
                {"matchLabels": service["spec"]["selector"]},
                w["spec"]["template"]["metadata"]["labels"],
            )
        ]
        assert len(engines) == 1, f"{host}: one Deployment behind each Service"
        workload, pod = engines[0]
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert labels["fairq.io/model"] == k8s.label_value(model["name"])
        assert labels["app.kubernetes.io/component"] == "engine"
        assert "replicas" not in workload["spec"], "KEDA sets them; an apply must not"
        _check_engine_container(pod["containers"][0], model["name"])
        _check_drain(pod, found["interval_s"])


def _check_drain(pod: Obj, discovery_interval_s: float) -> None:
    """The engine's preStop drains it: after fairq stopped sending, until it holds no
    request, within the pod's grace period."""
    command = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    if command[0] == "python3":  # vLLM's image: the script an init container put there
        (init,) = pod["initContainers"]
        assert init["args"][:2] == ["k8s", "install-drain"]
        assert command[1] == f"{init['args'][2]}/fairq_drain.py"
    else:
        assert command[:3] == ["fairq", "k8s", "drain"]
    options = dict(zip(command[-6::2], command[-5::2], strict=True))
    assert options["--url"] == "http://127.0.0.1:8000"
    assert float(options["--settle-s"]) > discovery_interval_s
    bound = float(options["--settle-s"]) + float(options["--timeout-s"])
    assert pod["terminationGracePeriodSeconds"] > bound


def _engine_scaled_objects(objects: list[Obj]) -> list[tuple[Obj, k8s.EngineSpec, Obj]]:
    """(the source's model entry, its engine spec, its ScaledObject) of each model,
    checked for what every trigger keeps: bounds, polling, the drained scale-down."""
    source = yaml.safe_load((K8S_DIR / "fairq.yaml").read_text())
    found = []
    for entry in source["models"]:
        scaled = named(objects, "ScaledObject", f"engine-{k8s.slug(entry['name'])}")
        spec = scaled["spec"]
        engine = k8s.EngineSpec.model_validate(entry.get("k8s", {}))
        assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (
            engine.min_replicas, engine.max_replicas,
        )  # fmt: skip
        assert spec["pollingInterval"] <= 10, "the demand is read within one poll"
        down = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
        assert down["stabilizationWindowSeconds"] >= 60 and spec["cooldownPeriod"] >= 60
        found.append((entry, engine, scaled))
    assert any(s["spec"]["minReplicaCount"] == 0 for _, _, s in found), (
        "the shipped configuration shows a model that scales to zero"
    )
    return found


@pytest.mark.parametrize("overlay", ["production", "simulator"])
def test_keda_scales_each_engine_on_its_models_demand_pushed_by_fairqs_scaler(
    overlay: str,
) -> None:
    objects = rendered(overlay)
    for entry, engine, scaled in _engine_scaled_objects(objects):
        assert named(objects, "Deployment", scaled["spec"]["scaleTargetRef"]["name"])
        (trigger,) = scaled["spec"]["triggers"]
        assert (trigger["type"], trigger["metricType"]) == ("external-push", "AverageValue")
        meta = trigger["metadata"]
        assert meta["model"] == entry["name"], "the scaler answers for the model by this name"
        assert meta["demandPerReplica"] == str(engine.demand_per_replica)
        host, port = meta["scalerAddress"].split(":")
        service_name, namespace, *domain = host.split(".")
        assert (namespace, domain) == ("fairq", ["svc", "cluster", "local"])
        service = named(objects, "Service", service_name)
        assert int(port) in [p["port"] for p in service["spec"]["ports"]]
        ((workload, _),) = [
            (w, pod) for w, pod in pod_specs(objects)
            if _selects({"matchLabels": service["spec"]["selector"]},
                        w["spec"]["template"]["metadata"]["labels"])
        ]  # fmt: skip
        (container,) = workload["spec"]["template"]["spec"]["containers"]
        args = container["args"]
        assert args[0] == "keda-scaler" and args[args.index("--port") + 1] == port
        assert args[args.index("--host") + 1] == "0.0.0.0", "KEDA calls from another pod"


@pytest.mark.parametrize("overlay", ["production", "simulator"])
def test_only_kedas_namespace_reaches_the_scaler(overlay: str) -> None:
    objects = rendered(overlay)
    peers = _allowed_sources(objects, _labels_of(objects, "keda-scaler"))
    keda = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}}
    scrapes = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    assert keda in peers and all(p in (keda, scrapes) for p in peers)


@cache
def _prometheus_render() -> tuple[Obj, ...]:
    """The engines' ScaledObjects of the shipped fairq.yaml with ``engine_trigger:
    prometheus``, and the base's files of that render."""
    import tempfile

    source = yaml.safe_load((K8S_DIR / "fairq.yaml").read_text())
    source["k8s"]["engine_trigger"] = "prometheus"
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "fairq.yaml").write_text(yaml.safe_dump(source))
        files = k8s.render(Path(folder))
    assert not set(k8s.SCALER_AND_CERTS) & set(files), "no scaler when KEDA reads Prometheus"
    base = yaml.safe_load(files[Path("base/kustomization.yaml")])
    assert "keda-scaler.yaml" not in base["resources"]
    objects = tuple(yaml.safe_load_all(files[Path("components/engine-scaling/scaledobjects.yaml")]))
    for obj in objects:
        obj["metadata"]["namespace"] = "fairq"  # as the overlays' kustomization sets it
    return objects


def prometheus_scaled_objects() -> list[Obj]:
    return copy.deepcopy(list(_prometheus_render()))


def test_keda_can_scale_each_engine_on_its_models_demand_in_prometheus_instead() -> None:
    objects = prometheus_scaled_objects()
    for obj in objects:
        validate(obj)
    deployments = [{"kind": "Deployment", "metadata": {"name": o["metadata"]["name"]}}
                   for o in objects]  # fmt: skip
    for entry, engine, scaled in _engine_scaled_objects([*objects, *deployments]):
        (trigger,) = scaled["spec"]["triggers"]
        assert trigger["type"] == "prometheus"
        meta = trigger["metadata"]
        assert f'model="{entry["name"]}"' in meta["query"] and "fairq_model_demand" in meta["query"]
        assert meta["activationThreshold"] == "0", "the first queued job wakes the model"
        assert meta["threshold"] == str(engine.demand_per_replica)
        assert meta["ignoreNullValues"] == "false", "lost metrics must not remove replicas"


def test_the_demand_keda_reads_is_a_series_the_dispatcher_exports() -> None:
    from broker import telemetry

    polled = next(
        o for o in prometheus_scaled_objects() if o["metadata"]["name"] == "engine-llama-3-1-8b"
    )
    query = polled["spec"]["triggers"][0]["metadata"]["query"]
    assert telemetry.MODEL_DEMAND.name in query and "model" in telemetry.MODEL_DEMAND.labels


def _check_engine_container(container: Obj, model: str) -> None:
    args = container["args"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    if container["image"].startswith("vllm/vllm-openai"):
        # The served name is what clients send and fairq passes through unchanged.
        assert args[args.index("--served-model-name") + 1] == model
        assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1
    else:
        assert args[0] == "sim" and args[args.index("--model") + 1] == model


def test_the_engines_vllm_is_the_release_fairqs_engine_claims_are_measured_on() -> None:
    # Admission reads vLLM's metrics by name; the benchmarks run this release's CPU build.
    # Releases before 0.11.0 also fetch media URLs a request names (CVE-2025-6242).
    from benchmarks.lib import vllm_engine

    measured = vllm_engine.VLLM.split("==")[1]
    images = {
        c["image"]
        for _, pod in pod_specs(rendered("production"))
        for c in pod["containers"]
        if c["image"].startswith("vllm/")
    }
    assert images == {f"vllm/vllm-openai:v{measured}"}


def test_the_simulator_overlay_asks_for_no_gpu_and_production_for_one_per_engine() -> None:
    def gpus(overlay: str) -> int:
        return sum(
            int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
            for _, pod in pod_specs(rendered(overlay))
            for c in pod["containers"]
        )

    assert gpus("simulator") == 0
    assert gpus("production") >= len(source_models())


# -- probes, resources, security --------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_has_a_readiness_probe_and_resource_requests(overlay: str) -> None:
    for workload, pod in pod_specs(rendered(overlay)):
        for container in pod["containers"]:
            where = f"{workload['metadata']['name']}/{container['name']}"
            assert "readinessProbe" in container, where
            assert {"cpu", "memory"} <= set(container["resources"]["requests"]), where
            assert "memory" in container["resources"].get("limits", {}), where
            if any(p["name"] == "http" for p in container.get("ports", [])):
                assert "livenessProbe" in container, f"{where} serves HTTP: probe its liveness"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_fairq_pods_run_as_the_images_non_root_user(overlay: str) -> None:
    for workload, pod, container in fairq_containers(rendered(overlay)):
        assert pod["securityContext"]["runAsNonRoot"] is True, workload["metadata"]["name"]
        assert pod["securityContext"]["runAsUser"] == 10001  # USER in the Dockerfile
        assert container["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_fairq_container_runs_a_fairq_command(overlay: str) -> None:
    commands = set(fairq_cli.commands)
    for workload, _, container in fairq_containers(rendered(overlay)):
        command = container["args"][0]
        if command == "batch-worker" and command not in commands:
            continue  # comes with the batch work; test_batch_worker_command_exists says so
        assert command in commands, workload["metadata"]["name"]
        probe = container.get("readinessProbe", {}).get("exec", {}).get("command")
        if probe:
            assert probe[:3] == ["fairq", "k8s", "probe"]


def test_batch_worker_command_exists() -> None:
    if "batch-worker" not in fairq_cli.commands:
        pytest.skip("`fairq batch-worker` is not in this branch yet (the RQ batch work adds it)")
    assert "batch-worker" in fairq_cli.commands


def test_every_deployment_with_more_than_one_replica_has_a_disruption_budget() -> None:
    objects = rendered("production")
    budgets = of_kind(objects, "PodDisruptionBudget")
    for workload in of_kind(objects, "Deployment"):
        if workload["spec"].get("replicas", 1) > 1:  # engines: KEDA's, drained on the way
            labels = workload["spec"]["template"]["metadata"]["labels"]
            assert any(_selects(b["spec"]["selector"], labels) for b in budgets), workload


# -- network policies -------------------------------------------------------------------


def _allowed_sources(objects: list[Obj], labels: Obj) -> list[Obj]:
    """The ``from`` peers of every ingress rule that selects a pod with ``labels``;
    a rule without ``from`` allows every source and shows as ``{}``."""
    peers: list[Obj] = []
    for policy in of_kind(objects, "NetworkPolicy"):
        if _selects(policy["spec"]["podSelector"], labels):
            for rule in policy["spec"].get("ingress", []):
                peers += rule.get("from", [{}])
    return peers


def _labels_of(objects: list[Obj], component: str) -> Obj:
    return next(
        w["spec"]["template"]["metadata"]["labels"]
        for w, _ in pod_specs(objects)
        if w["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == component
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_expose_only_the_gateway(overlay: str) -> None:
    objects = rendered(overlay)
    assert any(
        p["spec"]["podSelector"] == {} and "ingress" not in p["spec"]
        for p in of_kind(objects, "NetworkPolicy")
    ), "a default deny of ingress"
    components = {
        w["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
        for w, _ in pod_specs(objects)
    }
    for component in components:
        open_to_all = {} in _allowed_sources(objects, _labels_of(objects, component))
        assert open_to_all == (component == "gateway"), component


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_workers_and_dispatchers_reach_the_engine_pods(overlay: str) -> None:
    objects = rendered(overlay)
    peers = _allowed_sources(objects, _labels_of(objects, "engine"))
    pod_peers = [p for p in peers if "podSelector" in p and "namespaceSelector" not in p]
    assert pod_peers
    others = [p for p in peers if p not in pod_peers]
    # Other namespaces only for scraping: the Prometheus component's "monitoring".
    assert all(
        p["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring"}
        for p in others
    )
    for component in ("gateway", "batch-worker", "redis", "dispatcher", "worker"):
        labels = {"app.kubernetes.io/component": component}
        reaches = any(_selects(p["podSelector"], labels) for p in pod_peers)
        assert reaches == (component in ("dispatcher", "worker")), component


# -- Redis and autoscaling --------------------------------------------------------------


@pytest.mark.parametrize("overlay", ["production", "simulator"])
def test_redis_keeps_an_aof_fsynced_every_second_on_a_volume_claim(overlay: str) -> None:
    redis = named(rendered(overlay), "StatefulSet", "redis")
    args = redis["spec"]["template"]["spec"]["containers"][0]["args"]
    options = dict(zip(args[::2], args[1::2], strict=True))
    assert options["--appendonly"] == "yes"
    assert options["--appendfsync"] == "everysec"
    assert options["--maxmemory-policy"] == "noeviction"  # never drop queued jobs
    (claim,) = redis["spec"]["volumeClaimTemplates"]
    mounts = redis["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    assert {"name": claim["metadata"]["name"], "mountPath": options["--dir"]} in mounts


def test_the_external_redis_overlay_runs_no_redis_and_points_fairq_elsewhere() -> None:
    objects = rendered("external-redis")
    assert not of_kind(objects, "StatefulSet")
    assert "redis:6379" not in _secret_value(objects, {"name": "fairq-redis", "key": "url"})


def test_keda_scales_workers_on_every_models_ready_stream() -> None:
    objects = rendered("production")
    scaled = named(objects, "ScaledObject", "worker")
    triggers = scaled["spec"]["triggers"]
    assert {t["metadata"]["stream"] for t in triggers} == {keys.ready(m) for m in source_models()}
    assert {t["metadata"]["consumerGroup"] for t in triggers} == {keys.READY_GROUP}
    assert {t["type"] for t in triggers} == {"redis-streams"}
    formula = scaled["spec"]["advanced"]["scalingModifiers"]["formula"]
    assert sorted(formula.split(" + ")) == sorted(t["name"] for t in triggers)
    assert named(objects, "Deployment", scaled["spec"]["scaleTargetRef"]["name"])
    auth = named(objects, "TriggerAuthentication", triggers[0]["authenticationRef"]["name"])
    for ref in auth["spec"]["secretTargetRef"]:
        assert _secret_value(objects, ref)
    hpa_targets = {
        h["spec"]["scaleTargetRef"]["name"] for h in of_kind(objects, "HorizontalPodAutoscaler")
    }
    assert "worker" not in hpa_targets, "KEDA makes its own HPA: two would fight"


@pytest.mark.parametrize("overlay", ["simulator", "external-redis"])
def test_without_keda_an_hpa_scales_the_workers(overlay: str) -> None:
    objects = rendered(overlay)
    assert "worker" not in {
        s["spec"]["scaleTargetRef"]["name"] for s in of_kind(objects, "ScaledObject")
    }
    targets = {
        h["spec"]["scaleTargetRef"]["name"] for h in of_kind(objects, "HorizontalPodAutoscaler")
    }
    assert {"gateway", "worker"} <= targets


# -- the image --------------------------------------------------------------------------


def test_dockerfile_builds_in_one_stage_and_runs_fairq_unprivileged_from_a_slim_one() -> None:
    parser = DockerfileParser(path=str(ROOT / "Dockerfile"))
    stages: list[list[dict[str, Any]]] = []
    for instruction in parser.structure:
        if instruction["instruction"] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    assert len(stages) >= 2, "multi-stage: a builder and a final image"
    final = stages[-1]
    values = {i["instruction"]: i["value"] for i in final}
    user = values["USER"].split(":")[0]
    assert user not in ("0", "root") and user.isdigit(), "a numeric non-root USER"
    assert values["ENTRYPOINT"] == '["fairq"]'
    assert any(i["instruction"] == "COPY" and "--from=builder" in i["value"] for i in final)
    runs = " ".join(i["value"] for i in final if i["instruction"] == "RUN")
    for tool in ("build-essential", "gcc", "pip install"):
        assert tool not in runs, f"the final stage must not install {tool}"
    builder = " ".join(i["value"] for i in stages[0] if i["instruction"] == "RUN")
    assert "pip wheel" in builder and "pip install" in builder


def test_dockerignore_lets_in_every_package_the_wheel_needs() -> None:
    rules = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [
        p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    ]
    for path in ["pyproject.toml", "README.md", *(f"{p}/" for p in packages)]:
        assert f"!{path}" in rules, f".dockerignore keeps {path} out of the build"


def test_every_data_file_of_the_packages_is_declared_package_data() -> None:
    """The image installs a wheel, not the source tree: a file the code reads at run
    time (a Lua script, a simulator profile) must be package data or the image lacks it."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = pyproject["tool"]["setuptools"]["package-data"]
    for package in ("broker", "dispatcher", "workers", "fairq"):
        for file in (ROOT / package).rglob("*"):
            if not file.is_file() or file.suffix in (".py", ".pyc") or "__pycache__" in file.parts:
                continue
            relative = file.relative_to(ROOT / package).as_posix()
            patterns = declared.get(package, [])
            assert any(fnmatch.fnmatch(relative, p) for p in patterns), f"{package}/{relative}"


@pytest.mark.parametrize("overlay", ["production", "simulator"])
def test_keda_and_its_scaler_authenticate_each_other_by_certificates_of_one_ca(
    overlay: str,
) -> None:
    objects = rendered(overlay)
    scaler = named(objects, "Deployment", "keda-scaler")
    pod = scaler["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    secrets = {v["name"]: v["secret"] for v in pod["volumes"] if "secret" in v}
    # Served with its own certificate, and only to clients its CA signed.
    flags = {flag: args[args.index(flag) + 1] for flag in ("--tls-cert", "--tls-key",
                                                            "--tls-client-ca")}  # fmt: skip
    tls_dir = flags["--tls-cert"].rsplit("/", 1)[0]
    (volume,) = [name for name, path in mounts.items() if path == tls_dir]
    assert flags == {"--tls-cert": f"{tls_dir}/tls.crt", "--tls-key": f"{tls_dir}/tls.key",
                     "--tls-client-ca": f"{tls_dir}/ca.crt"}  # fmt: skip
    server_secret = secrets[volume]["secretName"]
    assert secrets[volume]["defaultMode"] == 0o440 and pod["securityContext"]["fsGroup"]
    # KEDA's side: every external-push trigger names the client certificate's Secret.
    scaled = [o for o in of_kind(objects, "ScaledObject") if o["metadata"]["name"] != "worker"]
    assert scaled
    auths = {t["authenticationRef"]["name"] for o in scaled for t in o["spec"]["triggers"]}
    (auth_name,) = auths
    auth = named(objects, "TriggerAuthentication", auth_name)
    refs = {r["parameter"]: (r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]}
    (client_secret,) = {name for name, _ in refs.values()}
    assert {p: key for p, (_, key) in refs.items()} == {
        "caCert": "ca.crt", "tlsClientCert": "tls.crt", "tlsClientKey": "tls.key"}  # fmt: skip
    # Both Secrets are cert-manager's, from one CA; the server's names the host KEDA dials.
    certificates = {c["spec"]["secretName"]: c for c in of_kind(objects, "Certificate")}
    server, client = certificates[server_secret], certificates[client_secret]
    assert server["spec"]["issuerRef"] == client["spec"]["issuerRef"]
    issuer = named(objects, "Issuer", server["spec"]["issuerRef"]["name"])
    assert certificates[issuer["spec"]["ca"]["secretName"]]["spec"]["isCA"] is True
    (trigger,) = scaled[0]["spec"]["triggers"]
    host = trigger["metadata"]["scalerAddress"].rsplit(":", 1)[0]
    assert host in server["spec"]["dnsNames"] and "server auth" in server["spec"]["usages"]
    assert "client auth" in client["spec"]["usages"]
