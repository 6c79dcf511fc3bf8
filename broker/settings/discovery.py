"""An engine's replicas found through DNS (``dispatcher.discovery`` follows them)."""

from __future__ import annotations

import ipaddress
import re
from typing import Literal

from pydantic import Field, field_validator

from broker.settings._base import Frozen

# A DNS name: dot-separated labels of letters, digits and hyphens (a trailing dot allowed).
_DNS_NAME = re.compile(r"^(?=.{1,253}\.?$)([A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9])?\.?)+$")


class DiscoveryConfig(Frozen):
    """An engine's replicas found through DNS: every A and AAAA record of ``dns`` is one
    endpoint, ``scheme://address:port``. A Kubernetes headless Service has one record per
    ready pod, so no API permissions are needed."""

    dns: str = Field(
        description="The DNS name whose A and AAAA records are the replicas, one endpoint "
        "each: a Kubernetes headless Service has one record per ready pod."
    )
    port: int = Field(ge=1, le=65535, description="The port of every replica's engine.")
    scheme: Literal["http", "https"] = Field(
        default="http",
        description="http or https; with https the engine's certificate must name the "
        "pod's IP address.",
    )
    interval_s: float = Field(default=5.0, gt=0, description="How often the records are read.")
    waking_interval_s: float = Field(
        default=0.1,
        gt=0,
        description="How often the records are read while the model has queued requests "
        "and no healthy replica (waking from zero): its first replica is found this soon "
        "after its record appears.",
    )
    nameservers: tuple[str, ...] = Field(
        default=(),
        description='The DNS servers to ask, each "address:port" (or a bare address: port '
        "53); empty: the system's resolver (/etc/resolv.conf).",
    )

    @field_validator("dns")
    @classmethod
    def _valid_dns(cls, name: str) -> str:
        if not _DNS_NAME.match(name):
            raise ValueError(
                f"dns {name!r} must be a DNS name, such as engine-llama.fairq.svc.cluster.local"
            )
        return name

    @field_validator("nameservers")
    @classmethod
    def _valid_nameservers(cls, servers: tuple[str, ...]) -> tuple[str, ...]:
        for server in servers:
            nameserver_address(server)
        return servers


def nameserver_address(server: str) -> tuple[str, int]:
    """``"10.0.0.10"``, ``"10.0.0.10:53"`` or ``"[fd00::a]:53"`` as (address, port)."""
    host, port = server, "53"
    if server.startswith("["):
        host, _, rest = server[1:].partition("]")
        port = rest.removeprefix(":") or port
    elif server.count(":") == 1:
        host, port = server.split(":")
    try:
        ipaddress.ip_address(host)
        number = int(port)
    except ValueError:
        number = 0
    if not 1 <= number <= 65535:
        raise ValueError(
            f"nameserver {server!r} must be an IP address with an optional port: "
            "10.0.0.10, 10.0.0.10:53 or [fd00::a]:53"
        )
    return host, number
