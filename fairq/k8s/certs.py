"""The KEDA scaler's certificates, issued by cert-manager (``components/scaler-certs``).

A CA of the deployment's own (a self-signed Issuer makes it; nothing outside the
namespace trusts it or is trusted by it), then from that CA the scaler's server
certificate, named for the Service KEDA dials (``ClusterSpec.scaler_address``), and
KEDA's client certificate. cert-manager writes each into a Secret with ``ca.crt``,
``tls.crt`` and ``tls.key``, the keys ``fairq.k8s.scaler`` mounts and names, and renews
them before they expire: the CA lasts ``CA_DURATION`` (its renewal would need every
certificate it signed issued again), the others cert-manager's default 90 days, and the
scaler serves a renewed pair from its next connection on (``scaler.tls``).
"""

from __future__ import annotations

from typing import Any

from fairq.k8s.scaler import CLIENT_SECRET, SERVER_SECRET
from fairq.k8s.spec import SCALER_NAME, ClusterSpec

_API = "cert-manager.io/v1"
_SELF_SIGNED = "fairq-selfsigned"
CA_NAME = "fairq-ca"  # the CA's Certificate, its Secret and the Issuer that signs with it
CA_DURATION = "87600h"  # ten years
_KEY = {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"}


def _issuer(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": _API, "kind": "Issuer", "metadata": {"name": name}, "spec": spec}


def _certificate(name: str, issuer: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": _API,
        "kind": "Certificate",
        "metadata": {"name": name},
        "spec": {
            "secretName": name,
            "privateKey": dict(_KEY),
            "issuerRef": {"name": issuer, "kind": "Issuer", "group": "cert-manager.io"},
            **spec,
        },
    }


def dns_names(cluster: ClusterSpec) -> list[str]:
    """The scaler Service's names inside the cluster, the last one KEDA's scalerAddress."""
    ns = cluster.namespace
    return [SCALER_NAME, f"{SCALER_NAME}.{ns}.svc", f"{SCALER_NAME}.{ns}.svc.cluster.local"]


def manifests(cluster: ClusterSpec) -> list[dict[str, Any]]:
    """The Issuers and Certificates of the scaler's mutual TLS."""
    return [
        _issuer(_SELF_SIGNED, {"selfSigned": {}}),
        _certificate(CA_NAME, _SELF_SIGNED, {
            "isCA": True, "commonName": CA_NAME, "duration": CA_DURATION,
        }),
        _issuer(CA_NAME, {"ca": {"secretName": CA_NAME}}),
        _certificate(SERVER_SECRET, CA_NAME, {
            "commonName": SCALER_NAME,
            "dnsNames": dns_names(cluster),
            "usages": ["server auth", "digital signature"],
        }),
        _certificate(CLIENT_SECRET, CA_NAME, {
            "commonName": "keda-operator",
            "usages": ["client auth", "digital signature"],
        }),
    ]  # fmt: skip
