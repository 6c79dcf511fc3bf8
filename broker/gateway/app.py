"""The gateway's FastAPI application: routes, error handlers and the lifespan.

The lifespan opens the per-process resources (``state.Gateway``) once and closes
them on shutdown. The OpenAPI schema is served at ``/openapi.json``
(``openapi``); the interactive docs are off: this is an API for machines, and
its contract is OpenAI's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from broker.gateway import (
    admin,
    admin_queues,
    batches,
    completions,
    files,
    health,
    jobs,
    models,
)
from broker.gateway.errors import install_handlers
from broker.gateway.openapi import install_openapi
from broker.gateway.state import opened
from broker.settings import Settings


def create_app(settings: Settings) -> FastAPI:
    """The gateway app; its Redis clients and result reader open with the lifespan."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with opened(settings) as gateway:
            app.state.gateway = gateway
            yield

    app = FastAPI(
        title="fairq gateway",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    for module in (completions, jobs, models, health, files, batches, admin, admin_queues):
        app.include_router(module.router)
    install_handlers(app)
    install_openapi(app, settings)
    return app
