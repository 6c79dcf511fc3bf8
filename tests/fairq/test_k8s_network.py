"""Who may reach what, computed from each overlay's NetworkPolicies and held to the table
of docs/operations.md, "Security".

The peers: every workload of the namespace (by its pod labels, at an address inside the
cluster), and outside it KEDA's operator, Prometheus, a pod of another namespace, the
cluster DNS, a client on the internet, a public HTTPS host and the cloud metadata
service. A connection is allowed when the source's egress policies allow it (or none
selects the source for egress, or the source is not in the namespace) and the
destination's ingress policies do (likewise), as Kubernetes evaluates them: peers by
pod and namespace selector or ipBlock, ports by number or name.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.fairq.test_k8s_manifests import rendered
from tests.support.kustomize import OVERLAYS

Obj = dict[str, Any]
NAMESPACE = "fairq"


@dataclass(frozen=True)
class Peer:
    name: str
    namespace: str | None  # None: outside the cluster
    labels: tuple[tuple[str, str], ...] = ()
    ip: str = "10.0.0.1"  # pods: inside the cluster's private range
    ports: tuple[tuple[str, int, str], ...] = field(default=())  # (name, port, protocol)


OUTSIDE = [
    Peer("keda", "keda", (("app", "keda-operator"),), "10.0.1.1"),
    Peer("monitoring", "monitoring", (("app.kubernetes.io/name", "prometheus"),), "10.0.2.1"),
    Peer("other-namespace", "default", (("app", "other"),), "10.0.3.1"),
    Peer("dns", "kube-system", (("k8s-app", "kube-dns"),), "10.0.4.1",
         (("dns", 53, "UDP"), ("dns-tcp", 53, "TCP"))),
    Peer("internet-client", None, ip="203.0.113.7"),
    Peer("public-https", None, ip="18.164.0.10", ports=(("https", 443, "TCP"),)),
    Peer("managed-redis", None, ip="52.0.0.9", ports=(("redis", 6380, "TCP"),)),
    Peer("metadata", None, ip="169.254.169.254", ports=(("http", 80, "TCP"),)),
]  # fmt: skip


def _fairq_peers(objects: list[Obj]) -> list[Peer]:
    peers = {}
    for obj in objects:
        if obj["kind"] not in ("Deployment", "StatefulSet"):
            continue
        pod = obj["spec"]["template"]
        labels = pod["metadata"]["labels"]
        ports = tuple(
            (p.get("name", ""), p["containerPort"], p.get("protocol", "TCP"))
            for c in pod["spec"]["containers"]
            for p in c.get("ports", [])
        )
        name = labels["app.kubernetes.io/component"]  # one engine stands for each model's
        peers[name] = Peer(name, NAMESPACE, tuple(sorted(labels.items())), "10.1.0.1", ports)
    return list(peers.values())


def _selects(selector: Obj | None, labels: dict[str, str]) -> bool:
    if selector is None:
        return True
    ok = all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())
    for expr in selector.get("matchExpressions", []):
        value, op = labels.get(expr["key"]), expr["operator"]
        ok &= {
            "In": value in expr.get("values", []),
            "NotIn": value not in expr.get("values", []),
            "Exists": value is not None,
            "DoesNotExist": value is None,
        }[op]
    return ok


def _peer_matches(rule_peer: Obj, peer: Peer) -> bool:
    if "ipBlock" in rule_peer:
        block = rule_peer["ipBlock"]
        address = ipaddress.ip_address(peer.ip)
        inside = address in ipaddress.ip_network(block["cidr"])
        return inside and not any(
            address in ipaddress.ip_network(e) for e in block.get("except", [])
        )
    if peer.namespace is None:
        return False  # selectors match pods only
    namespace_labels = {"kubernetes.io/metadata.name": peer.namespace}
    if "namespaceSelector" in rule_peer:
        if not _selects(rule_peer["namespaceSelector"], namespace_labels):
            return False
    elif peer.namespace != NAMESPACE:
        return False  # a podSelector alone: the policy's own namespace
    return _selects(rule_peer.get("podSelector"), dict(peer.labels))


def _port_matches(rule_ports: list[Obj] | None, dest: Peer, port_protocol: str) -> bool:
    number_text, protocol = port_protocol.split("/")
    port = int(number_text)
    if not rule_ports:
        return True
    named = {name: number for name, number, _ in dest.ports}
    for entry in rule_ports:
        if entry.get("protocol", "TCP") != protocol:
            continue
        wanted = entry.get("port")
        if wanted is None or (named.get(wanted) if isinstance(wanted, str) else wanted) == port:
            return True
    return False


def _allowed(
    policies: list[Obj], direction: str, subject: Peer, other: Peer, *, dest: Peer, port: str
) -> bool:
    """Whether the policies selecting ``subject`` let it talk to ``other`` in ``direction``
    (Ingress: other -> subject; Egress: subject -> other)."""
    if subject.namespace != NAMESPACE:
        return True  # another namespace's policies are not ours to hold
    selecting = [
        p for p in policies
        if direction in p["spec"].get("policyTypes", ["Ingress"])
        and _selects(p["spec"]["podSelector"], dict(subject.labels))
    ]  # fmt: skip
    if not selecting:
        return True
    key, peers_key = direction.lower(), "from" if direction == "Ingress" else "to"
    return any(
        (peers_key not in rule or any(_peer_matches(r, other) for r in rule[peers_key]))
        and _port_matches(rule.get("ports"), dest, port)
        for policy in selecting
        for rule in policy["spec"].get(key, [])
    )


def reachability(objects: list[Obj]) -> set[tuple[str, str, str]]:
    """Every (source, destination, "port/protocol") the policies allow."""
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    peers = _fairq_peers(objects) + OUTSIDE
    table = set()
    for source in peers:
        for dest in peers:
            if source is dest or NAMESPACE not in (source.namespace, dest.namespace):
                continue  # between two outsiders: not this namespace's to allow
            for _, number, protocol in dest.ports:
                port = f"{number}/{protocol}"
                if _allowed(policies, "Egress", source, dest, dest=dest, port=port) and _allowed(
                    policies, "Ingress", dest, source, dest=dest, port=port
                ):
                    table.add((source.name, dest.name, port))
    return table


FAIRQ = ("gateway", "dispatcher", "worker", "batch-worker", "keda-scaler")
OUTSIDERS = tuple(p.name for p in OUTSIDE)


def intended(overlay: str) -> set[tuple[str, str, str]]:
    """The table docs/operations.md, "Security", states."""
    # The engines' KEDA scaler comes with their scaling (components/engine-scaling), which
    # the external-redis overlay leaves out.
    scaled = overlay != "external-redis"
    fairq = [p for p in FAIRQ if scaled or p != "keda-scaler"]
    table = {(p, "dns", port) for p in (*fairq, "engine") for port in ("53/UDP", "53/TCP")}
    table |= {(p, "gateway", "8000/TCP") for p in OUTSIDERS}  # clients: the gateway only
    table |= {(p, "engine", "8000/TCP") for p in ("dispatcher", "worker")}
    if not scaled:
        table |= {(p, "managed-redis", "6380/TCP") for p in fairq}
        table |= {(p, "public-https", "443/TCP") for p in ("engine",)}  # the weights
        return table
    table |= {("keda", "keda-scaler", "9467/TCP")}  # KEDA calls the engines' scaler
    table |= {("redis", "dns", p) for p in ("53/UDP", "53/TCP")}
    table |= {(p, "redis", "6379/TCP") for p in fairq}
    table |= {
        ("monitoring", p, "9464/TCP") for p in ("gateway", "dispatcher", "worker", "keda-scaler")
    }
    if overlay == "production":
        table |= {("keda", "redis", "6379/TCP")}  # the workers' redis-streams triggers
        table |= {("engine", "public-https", "443/TCP")}  # vLLM downloads its weights
    return table


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_policies_let_exactly_the_intended_peers_talk(overlay: str) -> None:
    got, want = reachability(rendered(overlay)), intended(overlay)
    assert sorted(got - want) == [], "allowed, and should not be"
    assert sorted(want - got) == [], "needed, and not allowed"


def test_the_table_is_computed_not_assumed() -> None:
    """An open policy shows up: ingress to every engine port from anywhere, and egress
    left open, each widen the table."""
    objects = rendered("production")
    opened = [*objects, {"kind": "NetworkPolicy", "spec": {
        "podSelector": {"matchLabels": {"app.kubernetes.io/component": "engine"}},
        "policyTypes": ["Ingress", "Egress"], "ingress": [{}], "egress": [{}]}}]  # fmt: skip
    extra = reachability(opened) - reachability(objects)
    assert ("monitoring", "engine", "8000/TCP") in extra
    assert ("engine", "metadata", "80/TCP") in extra
