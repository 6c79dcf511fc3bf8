"""The gateway's FastAPI application: routes, error handlers and the lifespan.

The lifespan opens the per-process resources (``state.Gateway``) once and closes
them on shutdown. The OpenAPI schema is served at ``/openapi.json``
(``openapi``); the interactive docs are off: this is an API for machines, and
its contract is OpenAI's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI
from starlette.types import Receive, Scope, Send

from broker.errors import NotSupported
from broker.settings import Settings
from gateway import (
    admin,
    admin_queues,
    batches,
    completions,
    files,
    health,
    jobs,
    models,
)
from gateway.errors import install_handlers
from gateway.openapi import install_openapi
from gateway.sse import SERVER_SEND
from gateway.state import opened


def create_app(settings: Settings) -> FastAPI:
    """The gateway app; its Redis clients and result reader open with the lifespan."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with opened(settings) as gateway:
            app.state.gateway = gateway
            yield

    app = _GatewayApp(
        title="fairq gateway",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        # No 307 from /path/ to /path: Starlette builds its Location from the Host header
        # the client sent, and redirects before any authentication. A trailing slash is
        # an unknown URL (404), as on OpenAI's API.
        redirect_slashes=False,
    )
    for module in (completions, jobs, models, health, admin, admin_queues):
        app.include_router(module.router)
    if settings.http.metrics_port is None:
        app.include_router(admin.metrics_router)
    # The Batch API runs on RQ, which cannot use a Redis Cluster (docs/operations.md).
    batch = [] if not settings.redis_cluster else [Depends(_batch_needs_single_redis)]
    for module in (files, batches):
        app.include_router(module.router, dependencies=batch)
    install_handlers(app)
    install_openapi(app, settings)
    return app


class _GatewayApp(FastAPI):
    """FastAPI that also leaves the server's own ``send`` in each request's scope.

    A streamed response sends its start through every middleware and then its body
    messages straight to the server (``sse``): the middlewares only watch for the
    start, and each layer they add costs every token a call.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[SERVER_SEND] = send
        await super().__call__(scope, receive, send)


def _batch_needs_single_redis() -> None:
    raise NotSupported(
        "the Batch API (/v1/files, /v1/batches) needs a single Redis: its batch workers "
        "run on RQ, which does not support Redis Cluster, and this gateway runs with "
        "redis_cluster=true; send the lines as separate requests, or run batches on a "
        "deployment with a single Redis",
        code="batch_needs_single_redis",
    )
