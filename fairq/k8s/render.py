"""``fairq k8s render``: the per-model Kubernetes manifests, written from one file.

The operator edits one file, ``deploy/k8s/fairq.yaml``: fairq's own configuration
(README "Configuration") in which each model may carry a ``k8s`` block (the Hugging
Face model to serve, GPUs, the replicas' bounds, extra vLLM arguments), and a top-level
``k8s`` block (namespace, images, the workers' scaling target, where KEDA reads
Prometheus). Adding a model is one entry there and one ``fairq k8s render``; the output
is plain YAML, committed, that ``kubectl apply -k`` takes with no plugin:

    base/fairq.yaml            fairq's config without the k8s blocks and the keys, each
                               model naming an entry of ``engines`` of its own, found
                               by DNS (``discovery``): the headless Service's records,
                               one per ready pod
    components/api-keys/api-keys.yaml   the Secret of the API keys, their hashes only
                               (``k8s_keys``), for the production overlays; none while
                               fairq.yaml lists no key (those overlays then do not build)
    overlays/simulator/demo-secrets.yaml   the demo's Secrets, every value public
                               (``k8s_secrets``: which Secret comes from where)
    base/kustomization.yaml    the base's resources: the hand-written ones and these
    engines/vllm/              per model: a vLLM Deployment + headless Service
    engines/sim/               the same names running ``fairq sim`` (clusters without GPUs)
    components/keda/scaledobject.yaml   the workers: one redis-streams trigger per model
    components/engine-scaling/scaledobjects.yaml   per model: its engine Deployment's
                               replicas follow the model's demand (``fairq_model_demand``)
    components/engine-scaling/keda-scaler.yaml   ``fairq keda-scaler``, the engines' KEDA
                               trigger, and the TriggerAuthentication of KEDA's client
                               certificate (``k8s_scaler``; with ``engine_trigger:
                               external-push``), listed by the generated kustomization.yaml
    components/scaler-certs/certificates.yaml   cert-manager's Issuers and Certificates
                               of the scaler's mutual TLS (``k8s_certs``; the same)

Engines scale to zero and back (``docs/operations.md``, "Scale to zero") on each
model's demand (queued in every band plus in flight). By default KEDA's trigger is
``external-push``: fairq's own scaler reads the demand from Redis and pushes a model's
first job to KEDA at once. ``engine_trigger: prometheus`` has KEDA poll Prometheus for
the series the dispatcher that owns the model exports instead. Any demand activates a
model at zero, and a model keeps its replicas while a job of it is in flight. An engine
pod that is stopped first leaves the Service's records (fairq sends it nothing new), then
its preStop hook waits until the engine runs and holds no request
(``fairq.k8s.drain``), within the pod's grace period.

Rendering is deterministic, so ``fairq k8s render --check`` (and the tests) can
tell when a committed file is stale, and ``write`` leaves a file that would not change
untouched and says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from broker import keys
from broker.settings import ModelConfig, split_entry
from fairq.k8s import certs as k8s_certs
from fairq.k8s import engines as k8s_engines
from fairq.k8s import keys as k8s_keys
from fairq.k8s import scaler as k8s_scaler
from fairq.k8s import secrets as k8s_secrets
from fairq.k8s.spec import ENGINE_PORT, ClusterSpec, EngineSpec, Model, label_value, slug

__all__ = [
    "API_KEYS_FILE", "ENGINE_PORT", "ClusterSpec", "EngineSpec", "Model", "find_dir", "label_value",
    "load_source", "render", "slug", "stale", "write",
]  # fmt: skip
_HEADER = f"{k8s_secrets.GENERATED} from deploy/k8s/fairq.yaml: edit that, not this.\n"
API_KEYS_FILE = Path("components/api-keys/api-keys.yaml")
CERTS_FILE = Path("components/scaler-certs/certificates.yaml")
SCALER_FILE = Path("components/engine-scaling/keda-scaler.yaml")
SCALER_AND_CERTS = (SCALER_FILE, CERTS_FILE)  # rendered only with engine_trigger external-push


def find_dir(start: Path) -> Path | None:
    """The ``deploy/k8s`` of the checkout ``start`` is in (itself, or a folder above it
    that holds ``deploy/k8s/fairq.yaml``), else the one beside the installed package."""
    for folder in (start, *start.parents):
        if (folder / "fairq.yaml").is_file() and (folder / "base").is_dir():
            return folder
        if (folder / "deploy" / "k8s" / "fairq.yaml").is_file():
            return folder / "deploy" / "k8s"
    beside = Path(__file__).resolve().parents[2] / "deploy" / "k8s"  # above fairq/k8s/
    return beside if (beside / "fairq.yaml").is_file() else None


def load_source(path: Path) -> tuple[ClusterSpec, list[Model], dict[str, Any]]:
    """Read ``fairq.yaml``; return the cluster block, the models, and fairq's own config
    (its ``api_keys`` included: ``render`` takes them out into their Secret)."""
    source = yaml.safe_load(path.read_text()) or {}
    cluster = ClusterSpec.model_validate(source.pop("k8s", None) or {})
    if "engines" in source:
        raise ValueError(
            f"{path.name} has an engines section: here each model entry carries its engine's "
            "settings (render writes base/fairq.yaml's engines, one per model, found by DNS); "
            "move them onto the model entries"
        )
    models, entries, engines = [], [], []
    for entry in source.get("models") or []:
        engine = EngineSpec.model_validate(entry.pop("k8s", None) or {})
        model = Model(entry["name"], slug(entry["name"]), engine)
        if "endpoints" in entry:
            raise ValueError(
                f"model {model.name!r} lists endpoints: in the cluster its engines are found "
                "by DNS (render writes its discovery); remove them"
            )
        entry["discovery"] = model.discovery(cluster)
        ModelConfig.model_validate(entry)  # a bad entry fails here, not in a pod at start-up
        # base/fairq.yaml in the two-entry form: the model names its engine, which holds
        # where it is (the model's Service) and the engine's settings.
        own, engine_entry = split_entry(entry, model.slug)
        models.append(model)
        entries.append(own)
        engines.append(engine_entry)
    if len({m.slug for m in models}) != len(models):
        raise ValueError("two model names map to the same Kubernetes name; rename one")
    rest = {key: value for key, value in source.items() if key != "models"}
    return cluster, models, {"engines": engines, "models": entries, **rest}


def render(k8s_dir: Path) -> dict[Path, str]:
    """Every generated file under ``k8s_dir`` with its content."""
    cluster, models, config = load_source(k8s_dir / "fairq.yaml")
    entries = config.pop("api_keys", None)
    files = {
        Path("base/fairq.yaml"): _HEADER + _dump(config),
        Path("base/kustomization.yaml"): _HEADER + _BASE_COMMENT + _dump(_base(cluster)),
        k8s_secrets.DEMO_FILE: _HEADER + k8s_secrets.dump(k8s_secrets.demo_manifests()),
    }
    if entries:
        files[API_KEYS_FILE] = _HEADER + _dump(k8s_keys.secret(entries, k8s_dir))
    scaling = ["scaledobjects.yaml"]
    if cluster.engine_trigger == "external-push":
        scaler = k8s_scaler.manifests(cluster)
        files[SCALER_FILE] = _HEADER + _dump_all(scaler)
        files[CERTS_FILE] = _HEADER + _dump_all(k8s_certs.manifests(cluster))
        scaling.append(SCALER_FILE.name)
    certs = [CERTS_FILE.name] if cluster.engine_trigger == "external-push" else []
    files[CERTS_FILE.with_name("kustomization.yaml")] = (
        _HEADER + _CERTS_COMMENT + _dump(_component(certs))
    )
    for kind, build in (("vllm", k8s_engines.vllm), ("sim", k8s_engines.sim)):
        names = []
        for model in models:
            name = f"{model.slug}.yaml"
            files[Path(f"engines/{kind}/{name}")] = _HEADER + _dump_all(list(build(cluster, model)))
            names.append(name)
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": names,
        }
        files[Path(f"engines/{kind}/kustomization.yaml")] = _HEADER + _dump(kustomization)
    keda = _scaled_object(cluster, models)
    files[Path("components/keda/scaledobject.yaml")] = _HEADER + _dump(keda)
    engines = [k8s_engines.scaled_object(cluster, model) for model in models]
    files[Path("components/engine-scaling/scaledobjects.yaml")] = _HEADER + _dump_all(engines)
    files[SCALER_FILE.with_name("kustomization.yaml")] = (
        _HEADER + _SCALING_COMMENT + _dump(_component(scaling))
    )
    return files


def stale(k8s_dir: Path) -> list[Path]:
    """Generated files whose committed content differs from a fresh render."""
    return [
        path
        for path, text in render(k8s_dir).items()
        if not (k8s_dir / path).is_file() or (k8s_dir / path).read_text() != text
    ]


def write(k8s_dir: Path) -> dict[Path, str]:
    """Render into ``k8s_dir``, removing engine files of models no longer listed; each
    file with what became of it: ``wrote``, ``unchanged`` (left as it was) or ``removed``."""
    files = render(k8s_dir)
    done: dict[Path, str] = {}
    # base/api-keys.yaml: where the keys' Secret was before components/api-keys.
    # base/keda-scaler.yaml: where the scaler was before components/engine-scaling.
    moved = ("base/keda-scaler.yaml", "base/api-keys.yaml")
    optional = [k8s_dir / p for p in (*moved, SCALER_FILE, API_KEYS_FILE, CERTS_FILE)]
    for kind in ("vllm", "sim"):
        optional += (k8s_dir / "engines" / kind).glob("*.yaml")
    for old in optional:
        if old.is_file() and old.relative_to(k8s_dir) not in files:
            old.unlink()
            done[old.relative_to(k8s_dir)] = "removed"
    for path, text in files.items():
        target = k8s_dir / path
        if target.is_file() and target.read_text() == text:
            done[path] = "unchanged"
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        done[path] = "wrote"
    return dict(sorted(done.items()))


_BASE_COMMENT = """\
# fairq's own components: gateway, dispatchers, workers, batch workers, their config,
# disruption budgets and network policies (the KEDA scaler of the engines is in
# ../components/engine-scaling). No Secret, no Redis
# and no engines: an overlay adds them (its secrets, fairq.k8s.secrets; ../redis or an
# external Redis; ../engines/vllm or ../engines/sim). fairq reads its configuration once
# at start-up: the ConfigMap's name carries a hash of the content, so a changed
# fairq.yaml rolls every pod that mounts it.
"""
_SCALING_COMMENT = """\
# Engines scaled by KEDA on each model's demand (docs/operations.md, "Scale to zero"):
# one ScaledObject per engine Deployment. Its trigger (deploy/k8s/fairq.yaml,
# k8s.engine_trigger): external-push, `fairq keda-scaler` (keda-scaler.yaml), which pushes
# a model's first job to KEDA at once, over mutual TLS (its certificates:
# ../scaler-certs); or prometheus, the series fairq_model_demand that the model's
# dispatcher exports, which needs a Prometheus that scrapes the dispatchers
# (../prometheus) at k8s.prometheus_address. Needs KEDA (>= 2.12).
"""
_CERTS_COMMENT = """\
# The KEDA scaler's mutual TLS, issued by cert-manager (docs/operations.md, "Security"):
# a CA of the deployment's own, the scaler's server certificate (Secret keda-scaler-tls,
# which ../engine-scaling/keda-scaler.yaml mounts) and KEDA's client certificate (Secret
# keda-scaler-client, which the TriggerAuthentication keda-scaler-client names). Needs
# cert-manager (>= 1.12). Without it, create the two Secrets by hand (keys ca.crt,
# tls.crt, tls.key) and leave this component out. Empty with engine_trigger prometheus.
"""
_BASE_RESOURCES = ["namespace.yaml", "gateway.yaml", "dispatcher.yaml", "worker.yaml",
                   "batch-worker.yaml", "network-policies.yaml"]  # fmt: skip


def _component(resources: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "kustomize.config.k8s.io/v1alpha1",
        "kind": "Component",
        "resources": resources,
    }


def _base(cluster: ClusterSpec) -> dict[str, Any]:
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": cluster.namespace,
        "labels": [{"pairs": {"app.kubernetes.io/part-of": "fairq"}, "includeSelectors": False}],
        "resources": list(_BASE_RESOURCES),
        "configMapGenerator": [{"name": "fairq-config", "files": ["fairq.yaml"]}],
    }


def _scaled_object(cluster: ClusterSpec, models: list[Model]) -> dict[str, Any]:
    # Workers serve every model, so the replicas follow the SUM of running jobs over the
    # models' ready streams (scalingModifiers), not the busiest model alone.
    triggers: list[dict[str, Any]] = [
        {
            "type": "redis-streams",
            "name": f"m{i}",
            "metadata": {
                "address": cluster.redis_address(),
                "stream": keys.ready(model.name),
                "consumerGroup": keys.READY_GROUP,
                # Pending entries = jobs claimed by a worker and not yet terminal.
                "pendingEntriesCount": str(cluster.worker_jobs_target),
            },
            "authenticationRef": {"name": "fairq-redis"},
        }
        for i, model in enumerate(models)
    ]
    formula = " + ".join(t["name"] for t in triggers) or "0"
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "worker"},
        "spec": {
            "scaleTargetRef": {"name": "worker"},
            "minReplicaCount": cluster.worker_min_replicas,
            "maxReplicaCount": cluster.worker_max_replicas,
            "pollingInterval": 10,
            "cooldownPeriod": 300,
            "advanced": {
                "scalingModifiers": {
                    "formula": formula,
                    "target": str(cluster.worker_jobs_target),
                    "metricType": "AverageValue",
                }
            },
            "triggers": triggers,
        },
    }


def _dump(doc: Any) -> str:
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=100)


def _dump_all(docs: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False, width=100)
