"""A model's engine manifests: the Deployment (vLLM, or ``fairq sim`` on clusters without
GPUs) with its preStop drain, the headless Service fairq discovers its pods by, and the
KEDA ScaledObject that scales the Deployment on the model's demand, through fairq's own
scaler or Prometheus (``fairq.k8s.render``)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from fairq.k8s import scaler as k8s_scaler
from fairq.k8s.secrets import ENGINE_SECRET
from fairq.k8s.spec import ENGINE_PORT, ClusterSpec, Model, label_value

_MODEL_LABEL = "fairq.io/model"
_MODEL_ANNOTATION = "fairq.io/model-name"
_DRAIN_DIR = "/opt/fairq-drain"  # where the vLLM pod's init container puts the drain script
# After a pod leaves the Service's records, a dispatcher may still send it work until it
# reads DNS again (its discovery interval) and the cluster DNS's cache ends (CoreDNS's
# kubernetes plugin answers with a 5 s TTL): the drain waits that long before it trusts
# an idle engine.
_DNS_TTL_S = 5
_HF_HOME, _VLLM_HOME = "/models", "/home/vllm"
# The vLLM pod runs as a user its image does not list: HOME and HF_HOME on volumes of its
# own, and USER set, as torch's compile cache asks getpass.getuser(), which fails for an
# unlisted user without it.
_VLLM_WRITABLE_ENV = (
    {"name": "HOME", "value": _VLLM_HOME},
    {"name": "HF_HOME", "value": _HF_HOME},
    {"name": "USER", "value": "vllm"},
)


def _labels(model: Model, runtime: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": runtime,
        "app.kubernetes.io/instance": model.service,
        "app.kubernetes.io/component": "engine",
        "app.kubernetes.io/part-of": "fairq",
        _MODEL_LABEL: label_value(model.name),
    }


def _metadata(model: Model, runtime: str) -> dict[str, Any]:
    return {
        "name": model.service,
        "labels": _labels(model, runtime),
        "annotations": {_MODEL_ANNOTATION: model.name},
    }


def _service(model: Model, runtime: str) -> dict[str, Any]:
    """The headless Service fairq discovers a model's engines by: one DNS record per
    ready pod, so a pod that is starting or stopping gets no admission."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(model, runtime),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": False,
            "selector": {"app.kubernetes.io/instance": model.service},
            "ports": [{"name": "http", "port": ENGINE_PORT, "targetPort": "http"}],
        },
    }


def _deployment(model: Model, runtime: str, pod_spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(model, runtime),
        "spec": {
            # No replicas: KEDA sets them (components/engine-scaling); an apply that named
            # a count would undo its scaling each time.
            # A GPU pod: stop an old one before starting its successor rather than need a
            # spare GPU for a rollout (the queue holds the requests meanwhile).
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
            },
            "selector": {"matchLabels": {"app.kubernetes.io/instance": model.service}},
            "template": {
                "metadata": {
                    "labels": _labels(model, runtime),
                    "annotations": {_MODEL_ANNOTATION: model.name},
                },
                "spec": pod_spec,
            },
        },
    }


def _http_probes(startup_s: int) -> dict[str, Any]:
    def probe(period_s: int, failures: int) -> dict[str, Any]:
        return {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": period_s,
            "timeoutSeconds": 3,
            "failureThreshold": failures,
        }

    return {
        "startupProbe": probe(10, max(1, startup_s // 10)),
        "readinessProbe": probe(5, 2),
        "livenessProbe": probe(10, 3),
    }


def _drain_args(cluster: ClusterSpec, model: Model) -> list[str]:
    """The drain's arguments: the engine on this pod, how long fairq may still send to it
    after the pod left the records, and the bound of the wait."""
    return [
        "--url", f"http://127.0.0.1:{ENGINE_PORT}",
        "--settle-s", str(_settle_s(cluster)),
        "--timeout-s", str(model.engine.drain_timeout_s),
    ]  # fmt: skip


def _grace_s(cluster: ClusterSpec, model: Model) -> int:
    """The pod's grace period: the drain's whole bound, then time for the engine to exit."""
    return _settle_s(cluster) + model.engine.drain_timeout_s + 30


def _settle_s(cluster: ClusterSpec) -> int:
    """How long a dispatcher may still send to a pod that left the records."""
    return math.ceil(cluster.discovery_interval_s) + _DNS_TTL_S


def vllm(cluster: ClusterSpec, model: Model) -> Iterator[dict[str, Any]]:
    engine = model.engine
    # The vLLM image has Python but not fairq: an init container from fairq's image copies
    # the drain script (standard library only) into a volume the engine's hook runs it from.
    drain = ["python3", f"{_DRAIN_DIR}/fairq_drain.py", *_drain_args(cluster, model)]
    container = {
        "name": "vllm",
        "image": cluster.vllm_image,
        "args": [
            "--model",
            engine.hf_model or model.name,
            "--served-model-name",
            model.name,  # clients' "model" passes through fairq as is
            "--port",
            str(ENGINE_PORT),
            *engine.vllm_args,
        ],
        "ports": [{"name": "http", "containerPort": ENGINE_PORT}],
        "env": [
            {
                "name": "HF_TOKEN",
                "valueFrom": {
                    "secretKeyRef": {"name": "hf-token", "key": "token", "optional": True}
                },
            },
            # vLLM's --api-key, read from its environment so that the key is in no
            # process's argv: /v1 answers only requests that carry it (the workers'
            # FAIRQ_ENGINE_API_KEY, the same Secret).
            {
                "name": "VLLM_API_KEY",
                "valueFrom": {"secretKeyRef": {"name": ENGINE_SECRET, "key": "api_key"}},
            },
            *_VLLM_WRITABLE_ENV,
        ],
        "resources": {
            "requests": {"cpu": engine.cpu, "memory": engine.memory, "nvidia.com/gpu": engine.gpus},
            "limits": {"memory": engine.memory, "nvidia.com/gpu": engine.gpus},
        },
        **_http_probes(startup_s=1800),  # downloading and loading weights takes minutes
        "lifecycle": {"preStop": {"exec": {"command": drain}}},
        "securityContext": _FAIRQ_CONTAINER_SECURITY,
        "volumeMounts": [
            {"name": "shm", "mountPath": "/dev/shm"},
            {"name": "hf-cache", "mountPath": _HF_HOME},
            {"name": "home", "mountPath": _VLLM_HOME},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "drain", "mountPath": _DRAIN_DIR, "readOnly": True},
        ],
    }
    copier = {
        "name": "drain-script",
        "image": cluster.fairq_image,
        "args": ["k8s", "install-drain", _DRAIN_DIR],
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
        "securityContext": _FAIRQ_CONTAINER_SECURITY,
        "volumeMounts": [{"name": "drain", "mountPath": _DRAIN_DIR}],
    }
    pod_spec = {
        # fsGroup: the volumes below are the user's, the only places vLLM writes to.
        "securityContext": {**_NON_ROOT, "fsGroup": _NON_ROOT["runAsGroup"]},
        "initContainers": [copier],
        "containers": [container],
        "volumes": [
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
            {"name": "hf-cache", "emptyDir": {}},
            {"name": "home", "emptyDir": {}},
            {"name": "tmp", "emptyDir": {}},
            {"name": "drain", "emptyDir": {"sizeLimit": "1Mi"}},
        ],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "terminationGracePeriodSeconds": _grace_s(cluster, model),
    }
    yield _deployment(model, "vllm", pod_spec)
    yield _service(model, "vllm")


_FAIRQ_CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
# fairq's image's USER; vLLM's image runs as root unless told, and needs no root: it
# writes only its caches (HOME), the weights (HF_HOME), /tmp and /dev/shm.
_NON_ROOT = {
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "runAsGroup": 10001,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def sim(cluster: ClusterSpec, model: Model) -> Iterator[dict[str, Any]]:
    container = {
        "name": "sim",
        "image": cluster.fairq_image,
        "args": ["sim", "--host", "0.0.0.0", "--port", str(ENGINE_PORT), "--model", model.name],
        "ports": [{"name": "http", "containerPort": ENGINE_PORT}],
        "resources": {
            "requests": {"cpu": "250m", "memory": "128Mi"},
            "limits": {"memory": "512Mi"},
        },
        **_http_probes(startup_s=60),
        "lifecycle": {
            "preStop": {
                "exec": {"command": ["fairq", "k8s", "drain", *_drain_args(cluster, model)]}
            }
        },
        "securityContext": _FAIRQ_CONTAINER_SECURITY,
    }
    pod_spec = {
        "securityContext": dict(_NON_ROOT),
        "containers": [container],
        "terminationGracePeriodSeconds": _grace_s(cluster, model),
    }
    yield _deployment(model, "fairq-sim", pod_spec)
    yield _service(model, "fairq-sim")


def scaled_object(cluster: ClusterSpec, model: Model) -> dict[str, Any]:
    """KEDA scales the model's engine Deployment on its demand (``k8s.engine_trigger``)."""
    engine = model.engine
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {
            "name": model.service,
            "labels": _labels(model, "engine-scaling"),
            "annotations": {_MODEL_ANNOTATION: model.name},
        },
        "spec": {
            "scaleTargetRef": {"name": model.service},
            "minReplicaCount": engine.min_replicas,
            "maxReplicaCount": engine.max_replicas,
            # KEDA asks at this pace: the prometheus trigger's wake delay at zero; the
            # external-push trigger wakes at once and uses it for the replicas above one.
            "pollingInterval": cluster.engine_polling_s,
            # The last replica goes only after this long without demand (KEDA's own step
            # to zero); the HPA's window below holds the steps between 1 and N.
            "cooldownPeriod": cluster.engine_scale_down_s,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        "scaleDown": {
                            "stabilizationWindowSeconds": cluster.engine_scale_down_s,
                            # One replica at a time: each drains before the next goes.
                            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
                        }
                    }
                }
            },
            "triggers": [_trigger(cluster, model)],
        },
    }


def _trigger(cluster: ClusterSpec, model: Model) -> dict[str, Any]:
    per_replica = str(model.engine.demand_per_replica)
    if cluster.engine_trigger == "external-push":
        # `fairq keda-scaler` (scaler): active while a job of the model is queued
        # or in flight, pushed on its first enqueue; replicas = ceil(demand / per replica).
        metadata = {
            "scalerAddress": cluster.scaler_address(),
            "model": model.name,
            "demandPerReplica": per_replica,
        }
        return {
            "type": "external-push",
            "name": "demand",
            "metricType": "AverageValue",
            "metadata": metadata,
            # Mutual TLS: KEDA's client certificate, and the CA of the scaler's.
            "authenticationRef": {"name": k8s_scaler.AUTH_NAME},
        }
    selector = f'namespace="{cluster.namespace}",model="{model.name}"'
    return {
        "type": "prometheus",
        "name": "demand",
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": cluster.prometheus_address,
            # max: during a lease hand-over two dispatchers may both report.
            "query": f"max(fairq_model_demand{{{selector}}})",
            "threshold": per_replica,
            # Active (at least one replica) as soon as one job is queued or in flight:
            # the first request wakes a model at zero, within a poll and a scrape.
            "activationThreshold": "0",
            # No series (Prometheus lost the dispatchers): an error, so KEDA keeps the
            # replicas, rather than a 0 that would remove them.
            "ignoreNullValues": "false",
        },
    }
