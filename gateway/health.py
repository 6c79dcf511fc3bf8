"""Probes: ``/healthz`` says the process serves HTTP; ``/readyz`` that Redis answers too."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from redis.exceptions import RedisError
from starlette.responses import Response

from broker.errors import BrokerUnavailable
from gateway.errors import error_response, json_response
from gateway.state import gateway_of

# Well under a kubelet's default probe timeout, so the probe gets our 503, not its own.
_PING_TIMEOUT_S = 0.8

router = APIRouter()


@router.get("/healthz")
async def healthz() -> Response:
    return json_response({"status": "ok"})


@router.get("/readyz")
async def readyz(request: Request) -> Response:
    try:
        async with asyncio.timeout(_PING_TIMEOUT_S):
            await gateway_of(request).redis.ping()
    except (RedisError, OSError, TimeoutError) as exc:
        reason = type(exc).__name__
        return error_response(BrokerUnavailable(f"Redis does not answer PING ({reason})"))
    return json_response({"status": "ok"})
