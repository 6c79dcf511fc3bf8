"""The KEDA external-push scaler's manifests (``fairq keda-scaler``, ``scaler``):
its Deployment, the Service KEDA's triggers name (``scalerAddress``), a disruption
budget, the NetworkPolicy that lets only KEDA's operator call it, and the
TriggerAuthentication that gives KEDA its client certificate. Rendered into the base
when ``k8s.engine_trigger`` is ``external-push`` (``fairq.k8s.render``).

The scaler authenticates its caller by mutual TLS (KEDA sends an external scaler no call
metadata, so a token is not possible): it serves the certificate of Secret
``SERVER_SECRET`` and takes only clients with a certificate of that Secret's CA, which
KEDA's operator presents from Secret ``CLIENT_SECRET`` (``TriggerAuthentication``
``AUTH_NAME``, which every external-push trigger names). Both Secrets have the keys a
cert-manager Certificate writes (``ca.crt``, ``tls.crt``, ``tls.key``):
``components/scaler-certs`` issues them (``fairq.k8s.certs``), or the operator creates
them by hand (docs/operations.md, "Security")."""

from __future__ import annotations

from typing import Any

from fairq.k8s.spec import SCALER_NAME, SCALER_PORT, ClusterSpec

_METRICS_PORT = 9464  # every fairq pod's /metrics port in the cluster (components/prometheus)
SERVER_SECRET = "keda-scaler-tls"  # the scaler's certificate and key, and their CA's
CLIENT_SECRET = "keda-scaler-client"  # KEDA's client certificate and key, and the CA's
AUTH_NAME = "keda-scaler-client"  # the TriggerAuthentication of every external-push trigger
_TLS_DIR = "/etc/fairq/tls"
_TLS_ARGS = (
    *("--tls-cert", f"{_TLS_DIR}/tls.crt", "--tls-key", f"{_TLS_DIR}/tls.key"),
    *("--tls-client-ca", f"{_TLS_DIR}/ca.crt"),
)
_LABELS = {"app.kubernetes.io/name": "fairq", "app.kubernetes.io/component": SCALER_NAME}
_SECURITY = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def _probe(period_s: int, failures: int) -> dict[str, Any]:
    # TCP, not a call: a scaler whose Redis is away still answers (UNAVAILABLE, so KEDA
    # keeps the replicas it has); restarting it would not bring Redis back.
    return {
        "tcpSocket": {"port": "grpc"},
        "periodSeconds": period_s,
        "timeoutSeconds": 3,
        "failureThreshold": failures,
    }


def _deployment(cluster: ClusterSpec) -> dict[str, Any]:
    container = {
        "name": SCALER_NAME,
        "image": cluster.fairq_image,
        "args": ["keda-scaler", "--host", "0.0.0.0", "--port", str(SCALER_PORT), *_TLS_ARGS],
        "env": [
            {"name": "FAIRQ_CONFIG", "value": "/etc/fairq/fairq.yaml"},
            {
                "name": "FAIRQ_REDIS_URL",
                "valueFrom": {"secretKeyRef": {"name": "fairq-redis", "key": "url"}},
            },
            {"name": "FAIRQ_METRICS_PORT", "value": str(_METRICS_PORT)},
            {"name": "FAIRQ_METRICS_HOST", "value": "0.0.0.0"},
        ],
        "ports": [
            {"name": "grpc", "containerPort": SCALER_PORT},
            {"name": "metrics", "containerPort": _METRICS_PORT},
        ],
        "readinessProbe": _probe(5, 2),
        "livenessProbe": _probe(10, 3),
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": _SECURITY,
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/fairq", "readOnly": True},
            {"name": "tls", "mountPath": _TLS_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},  # a read-only root: Python's temp files
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": SCALER_NAME, "labels": dict(_LABELS)},
        "spec": {
            # Two: KEDA's streams reconnect to the other while one restarts. Each reads
            # Redis on its own, so both give the same answers.
            "replicas": 2,
            "selector": {"matchLabels": dict(_LABELS)},
            "template": {
                "metadata": {"labels": dict(_LABELS)},
                "spec": {
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 10001,
                        "runAsGroup": 10001,
                        # The Secret's files are the group's, readable by it alone (0440).
                        "fsGroup": 10001,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "terminationGracePeriodSeconds": 10,
                    "containers": [container],
                    "volumes": [
                        {"name": "config", "configMap": {"name": "fairq-config"}},
                        {
                            "name": "tls",
                            "secret": {"secretName": SERVER_SECRET, "defaultMode": 0o440},
                        },
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    }


def manifests(cluster: ClusterSpec) -> list[dict[str, Any]]:
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SCALER_NAME, "labels": dict(_LABELS)},
        "spec": {
            "selector": dict(_LABELS),
            "ports": [{"name": "grpc", "port": SCALER_PORT, "targetPort": "grpc"}],
        },
    }
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": SCALER_NAME},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": dict(_LABELS)}},
    }
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": f"{SCALER_NAME}-from-keda"},
        "spec": {
            "podSelector": {"matchLabels": {"app.kubernetes.io/component": SCALER_NAME}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {
                                    "kubernetes.io/metadata.name": cluster.keda_namespace
                                }
                            }
                        }
                    ],
                    "ports": [{"protocol": "TCP", "port": SCALER_PORT}],
                }
            ],
        },
    }
    return [_deployment(cluster), service, budget, policy, trigger_authentication()]


def trigger_authentication() -> dict[str, Any]:
    """KEDA's client certificate for the scaler, and the CA it checks the scaler's with
    (KEDA's external-push parameters caCert, tlsClientCert, tlsClientKey)."""
    keys = {"caCert": "ca.crt", "tlsClientCert": "tls.crt", "tlsClientKey": "tls.key"}
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "TriggerAuthentication",
        "metadata": {"name": AUTH_NAME},
        "spec": {
            "secretTargetRef": [
                {"parameter": parameter, "name": CLIENT_SECRET, "key": key}
                for parameter, key in keys.items()
            ]
        },
    }
