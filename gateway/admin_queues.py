"""Queue inspection for operators: ``GET /v1/admin/queues`` and
``GET /v1/admin/models/{model}/queue`` (see ``broker.inspection`` for the fields).

Only keys with ``admin: true`` see these routes (``auth.Admin``). Anyone else gets the
same 404 as an unknown URL, so the admin surface cannot be discovered with a user's
key; the public OpenAPI document leaves them out.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from broker.errors import UnknownModel
from broker.inspection import model_queue
from gateway.auth import Admin
from gateway.errors import json_response
from gateway.state import gateway_of

router = APIRouter(include_in_schema=False)


@router.get("/v1/admin/queues")
async def all_queues(request: Request, caller: Admin) -> Response:
    """Every configured model's queues."""
    gateway = gateway_of(request)
    bands = gateway.settings.bands
    data = [await model_queue(gateway.redis, m.name, bands) for m in gateway.settings.models]
    return json_response({"object": "list", "data": data})


@router.get("/v1/admin/models/{model:path}/queue")
async def one_queue(model: str, request: Request, caller: Admin) -> Response:
    """One model's queues: per band the backlog, the next users and the top users."""
    gateway = gateway_of(request)
    if gateway.settings.model(model) is None:
        raise UnknownModel(f"The model `{model}` does not exist.")
    return json_response(await model_queue(gateway.redis, model, gateway.settings.bands))
