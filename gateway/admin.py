"""The operator's routes: ``/metrics`` (Prometheus), ``/admin/status`` and ``/dashboard``.

``/admin/status`` answers admin API keys only (``auth.Admin``; to anyone else it is an
unknown URL): every model's status snapshot as ``fairq status --json`` prints it
(``broker.status``), and beside it ``wait_now``: per band, what a job queued now would be
told of its wait (``broker.position.band_waits``), from a new user (whom fairness lets in
soonest) and at the back of the band (behind every job queued in it and above); and
``quotas``: each configured quota's use of its limits now (``broker.quota_status``, one
pipelined read for all).
``/dashboard`` is one static page (no external assets: the chart is drawn on a canvas)
that asks for an admin key, keeps it in the tab's session storage, and polls
``/admin/status``; the page itself holds no data, so it is served to anyone. ``/metrics``
is the gateway's own series, unauthenticated as Prometheus expects: on the HTTP port
unless ``http.metrics_port`` serves it on a port of its own (``fairq.services``), as the
Kubernetes manifests do. None of them is part of the public API: the OpenAPI document
leaves them out.
"""

from __future__ import annotations

import asyncio
import time
from importlib import resources

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from redis.asyncio import Redis
from starlette.responses import HTMLResponse, Response

from broker.demand import state_of
from broker.position import read_band_waits
from broker.quota_status import read_quotas
from broker.settings import Settings
from broker.status import read_status
from gateway.auth import Admin
from gateway.errors import json_response
from gateway.state import gateway_of

router = APIRouter(include_in_schema=False)
# On the HTTP port only where ``http.metrics_port`` does not give /metrics a port of its own
metrics_router = APIRouter(include_in_schema=False)

_PAGE = resources.files("gateway").joinpath("static/dashboard.html")


@metrics_router.get("/metrics")
async def metrics() -> Response:
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)


@router.get("/admin/status")
async def admin_status(request: Request, caller: Admin) -> Response:
    gateway = gateway_of(request)
    now_ms = int(time.time() * 1000)
    # A Redis error is the app's 503 (``errors``), which keeps its text from the client.
    models = await read_status(gateway.redis, gateway.settings, now_ms)
    quotas, waits = await asyncio.gather(
        read_quotas(gateway.redis, gateway.settings.quotas),
        asyncio.gather(*(_wait_now(gateway.redis, gateway.settings, m) for m in models)),
    )
    for model, wait in zip(models, waits, strict=True):
        model["wait_now"] = wait
    return json_response(
        {
            "object": "fairq.status",
            "at_ms": now_ms,
            "models": models,
            "quotas": [q.public() for q in quotas],
        }
    )


async def _wait_now(redis: Redis, settings: Settings, model: dict[str, object]) -> list[object]:
    """Per band, the positions of a job queued now; while the model is starting, without a
    figure, as a queued job's (``gateway.jobs``)."""
    waits = await read_band_waits(redis, str(model["model"]), settings.bands)
    starting = model.get("source") == "dispatcher" and state_of(model) == "starting"
    return [(w.starting() if starting else w).public() for w in waits]


@router.get("/dashboard")
async def dashboard() -> Response:
    headers = {"Cache-Control": "no-store", "Content-Security-Policy": _CSP}
    return HTMLResponse(_PAGE.read_text(encoding="utf-8"), headers=headers)


# Everything the page loads comes from the gateway itself; nothing may frame it.
_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'"
)
