"""The gateway's HTTP connections (``gateway/connections.py``): what one client may hold,
and where its own /metrics is served."""

from __future__ import annotations

from pydantic import Field

from broker.settings._base import Frozen


class HttpSettings(Frozen):
    """What one client's connections to a gateway process may hold, and for how long."""

    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="A request's headers must all arrive within this, counted from the "
        "connection (or from a keep-alive request's first byte): else 408, and closed. A "
        "connection that sends nothing at all is closed without an answer.",
    )
    body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="Longest silence while a request body arrives: else 408, and closed.",
    )
    keep_alive_s: float = Field(
        default=120.0,
        gt=0,
        description="An idle keep-alive connection is closed after this. It must outlast "
        "the idle expiry of the clients' pools (httpx and the OpenAI SDK 5 s, aiohttp 15 s, "
        "Go 90 s) and of proxies in front (nginx, AWS ALB: 60 s): a server that closes "
        "first races the client's next request on that connection, which then fails.",
    )
    max_connections: int = Field(
        default=2048,
        ge=1,
        description="Open connections per gateway process, idle ones included; one more "
        "gets a 503 (too_many_connections, Retry-After: 1) and is closed.",
    )
    discard_body_bytes: int = Field(
        default=64 << 20,
        ge=0,
        description="A body still arriving after its answer (a 413 on its declared length, "
        "or that 503) is read and dropped up to this many bytes, so that a client that "
        "sends its whole body before it reads gets the answer; beyond, the connection is "
        "closed.",
    )
    metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="The gateway's Prometheus /metrics on a port of its own, on "
        "metrics_host, and not on its HTTP port. null: on its HTTP port beside the API, "
        "unauthenticated as Prometheus expects; a deployment whose HTTP port is reachable "
        "from outside (an Ingress) sets this, as the Kubernetes manifests do.",
    )
