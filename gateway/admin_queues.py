"""Queue inspection for operators: ``GET /v1/admin/queues`` and
``GET /v1/admin/models/{model}/queue`` (see ``broker.inspection`` for the fields).

Only keys with ``admin: true`` see these routes. Any other key gets the same 404
as an unknown URL, so the admin surface cannot be discovered with a user's key.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from broker.auth import Principal
from broker.errors import NotFound, UnknownModel
from broker.inspection import model_queue
from gateway.auth import Caller
from gateway.errors import json_response
from gateway.state import gateway_of

router = APIRouter()


def _require_admin(request: Request, caller: Principal) -> None:
    if not caller.admin:
        raise NotFound(f"Invalid URL ({request.method} {request.url.path})", code="unknown_url")


@router.get("/v1/admin/queues")
async def all_queues(request: Request, caller: Caller) -> Response:
    """Every configured model's queues."""
    _require_admin(request, caller)
    gateway = gateway_of(request)
    bands = gateway.settings.bands
    data = [await model_queue(gateway.redis, m.name, bands) for m in gateway.settings.models]
    return json_response({"object": "list", "data": data})


@router.get("/v1/admin/models/{model:path}/queue")
async def one_queue(model: str, request: Request, caller: Caller) -> Response:
    """One model's queues: per band the backlog, the next users and the top users."""
    _require_admin(request, caller)
    gateway = gateway_of(request)
    if gateway.settings.model(model) is None:
        raise UnknownModel(f"The model `{model}` does not exist.")
    return json_response(await model_queue(gateway.redis, model, gateway.settings.bands))
