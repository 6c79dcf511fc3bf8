"""The caller of every /v1 route: ``Authorization: Bearer <key>`` to a ``Principal``;
``Admin``, the caller of an admin route, who must hold an admin key."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from broker.auth import Principal
from broker.errors import Unauthorized
from gateway.errors import unknown_url
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


async def authenticate_admin(request: Request) -> Principal:
    """Anyone without an admin key, a caller with no key or a wrong one included, gets the
    404 of an unknown URL: a 401 or a 403 would tell that the route exists."""
    try:
        caller = await authenticate(request)
    except Unauthorized:
        raise unknown_url(request) from None
    if not caller.admin:
        raise unknown_url(request)
    return caller


Caller = Annotated[Principal, Depends(authenticate)]
Admin = Annotated[Principal, Depends(authenticate_admin)]
