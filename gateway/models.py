"""``GET /v1/models``: the models the caller's key may use, in OpenAI's list shape."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from starlette.responses import Response

from broker.errors import UnknownModel
from gateway.auth import Caller
from gateway.errors import json_response
from gateway.state import gateway_of

router = APIRouter()

# Models come from the configuration, which has no dates: report the process start.
_CREATED = int(time.time())


def _entry(name: str) -> dict[str, object]:
    return {"id": name, "object": "model", "created": _CREATED, "owned_by": "fairq"}


@router.get("/v1/models")
async def list_models(request: Request, caller: Caller) -> Response:
    models = gateway_of(request).settings.models
    data = [_entry(m.name) for m in models if caller.may_use_model(m.name)]
    return json_response({"object": "list", "data": data})


@router.get("/v1/models/{name:path}")
async def get_model(name: str, request: Request, caller: Caller) -> Response:
    if gateway_of(request).settings.model(name) is None or not caller.may_use_model(name):
        raise UnknownModel(f"The model `{name}` does not exist or you do not have access to it.")
    return json_response(_entry(name))
