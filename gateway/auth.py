"""The caller of every /v1 route: ``Authorization: Bearer <key>`` to a ``Principal``."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from broker.auth import Principal
from gateway.state import gateway_of


def bearer_key(header: str | None) -> str | None:
    """The key of a bearer ``Authorization`` header, or None (answered as a missing key)."""
    if not header:
        return None
    scheme, _, key = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return key.strip() or None


async def authenticate(request: Request) -> Principal:
    key = bearer_key(request.headers.get("authorization"))
    return gateway_of(request).keyring.resolve(key)


Caller = Annotated[Principal, Depends(authenticate)]
